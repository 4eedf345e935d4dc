//! `WriteFile`: a file per event, written atomically under a base directory,
//! in a directory named after the event's source and a file named after its
//! id, so that a re-run overwrites instead of duplicating and two sources'
//! events with the same id never share a file.
//!
//! The write: a temporary file in the target directory, write, fsync, rename
//! over the target, fsync the directory. A reader sees the old file or the new
//! one, never half of one; after the directory fsync the new name survives a
//! power cut. Temporary names start with `.` (a file name never does) and are
//! fixed per attempt (`.{name}.{attempt}.tmp`), so a later attempt removes
//! what a crashed one left.
//!
//! Nothing planted in the directory is followed: the temporary file is
//! created new (`create_new`: `O_CREAT | O_EXCL`, which refuses an existing
//! name, a symbolic link included) and, on unix, opened with `O_NOFOLLOW`;
//! a sub-directory that exists as a symbolic link is refused; the rename
//! replaces a link at the target name instead of writing through it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tickmark::{Step, StepContext, StepError, StepResult};

use crate::value_from::ValueFrom;

/// The longest file name (without extension) made from an event id, in
/// bytes; longer ones are cut and end in `%-` and the SHA-256 of the id.
/// With the extension and the temporary suffix a name stays well under the
/// usual 255-byte limit.
pub const MAX_STEM_BYTES: usize = 180;

/// What ends a name that carries the id's hash: `%-` (which escaping never
/// makes) and 64 hex digits.
const HASH_SUFFIX_BYTES: usize = 2 + 64;

/// The longest extension accepted, in bytes.
pub const MAX_EXTENSION_BYTES: usize = 16;

/// How many earlier attempts' temporary files a write looks for.
const CLEANUP_ATTEMPTS: u32 = 64;

/// The base directory [`WriteFile`] writes under: an engine resource
/// (`Engine::with_resource(OutputDir::new("/var/lib/app/out"))`), so that
/// where files go is the deployment's choice, not the stored plan's. It is
/// created when missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputDir(pub PathBuf);

impl OutputDir {
    /// Files go under `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }
}

/// Writes one file per event:
/// `{OutputDir}/{subdir}/{escaped source}/{escaped event id}.{extension}`.
///
/// - **Name**: the event id with every byte outside `[A-Za-z0-9._-]` (and a
///   leading `.`) written as `%XX`, so an id is never a path, never `.` or
///   `..`, never hidden, and two ids never share a name, even on a
///   file system that ignores case ([`file_name_for`]). The directory above
///   it is the source, escaped the same way: dedup keys are unique per
///   source only, so `stripe`'s `evt_1` and `github`'s `evt_1` are two files.
/// - **Content**: a [`ValueFrom`]: the event payload, a JSON pointer into an
///   earlier step's output, a fixed value, or a template (`{event_id}`,
///   `{source}`, `{kind}`, …). A string is written as it is; any other value as
///   pretty-printed JSON with a final newline.
/// - **Resource**: [`OutputDir`], the base directory.
/// - **Outcome**: the output is `{"path", "bytes"}`. A re-run writes the same
///   name again: the file is replaced, never duplicated. A bad `subdir`,
///   `extension` or content is terminal; an I/O error (a full disk, a
///   permission) is retryable.
///
/// ```
/// use tickmark::{Engine, Handler, Handlers, NewEvent, WorkerConfig};
/// use tickmark_steps::{OutputDir, ValueFrom, WriteFile};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}", dir.path().join("w.db").display());
/// let handlers = Handlers::new().on(
///     "shop",
///     "order.paid",
///     Handler::new().step(WriteFile::new(ValueFrom::event()).subdir("orders").extension("json")),
/// );
/// let out = dir.path().join("out");
/// let engine = Engine::new(tickmark::connect(&url).await?, handlers)?
///     .with_resource(OutputDir::new(&out));
/// engine
///     .accept(NewEvent::with_id("shop", "ord/7", "order.paid", serde_json::json!({"total": 5})))
///     .await?;
/// engine.worker(WorkerConfig::default())?.run_until_idle().await?;
///
/// let written = std::fs::read_to_string(out.join("orders/shop").join("ord%2F7.json"))?;
/// assert_eq!(serde_json::from_str::<serde_json::Value>(&written)?["total"], 5);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteFile {
    /// What to write.
    pub content: ValueFrom,
    /// A relative directory under the [`OutputDir`] (`/`-separated names of
    /// `[A-Za-z0-9._-]`, none starting with `.`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdir: Option<String>,
    /// The file extension, without the dot (`json`, `txt`): ASCII letters and
    /// digits only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension: Option<String>,
}

impl WriteFile {
    /// Write `content` to a file named after the event id.
    pub fn new(content: ValueFrom) -> Self {
        Self {
            content,
            subdir: None,
            extension: None,
        }
    }

    /// Write under `subdir` of the output directory.
    #[must_use]
    pub fn subdir(mut self, subdir: impl Into<String>) -> Self {
        self.subdir = Some(subdir.into());
        self
    }

    /// Give the file this extension (without the dot).
    #[must_use]
    pub fn extension(mut self, extension: impl Into<String>) -> Self {
        self.extension = Some(extension.into());
        self
    }

    /// The directory and file name for `source`'s `event_id`, relative to
    /// the base.
    fn target(&self, source: &str, event_id: &str) -> Result<(PathBuf, String), StepError> {
        let mut dir = match &self.subdir {
            Some(subdir) => checked_subdir(subdir)?,
            None => PathBuf::new(),
        };
        // Escaped like a file name: one plain component, never `.`, `..` or a
        // path, whatever the source is called.
        dir.push(file_name_for(source));
        let mut name = file_name_for(event_id);
        if let Some(extension) = &self.extension {
            let extension = extension.strip_prefix('.').unwrap_or(extension);
            if extension.is_empty()
                || extension.len() > MAX_EXTENSION_BYTES
                || !extension.bytes().all(|b| b.is_ascii_alphanumeric())
            {
                return Err(StepError::terminal(format!(
                    "extension `{extension}` must be 1 to {MAX_EXTENSION_BYTES} ASCII letters or digits"
                )));
            }
            name.push('.');
            name.push_str(extension);
        }
        Ok((dir, name))
    }
}

#[typetag::serde(name = "tickmark.write_file")]
#[async_trait::async_trait]
impl Step for WriteFile {
    fn reads(&self) -> Vec<&str> {
        self.content.reads_step().into_iter().collect()
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let (subdir, name) = self.target(&ctx.event().source, &ctx.event().id)?;
        let bytes = match self.content.resolve(ctx)?.as_ref() {
            Value::String(text) => text.clone().into_bytes(),
            other => {
                let mut bytes = serde_json::to_vec_pretty(other).map_err(|error| {
                    StepError::terminal(format!("content cannot be encoded: {error}"))
                })?;
                bytes.push(b'\n');
                bytes
            }
        };
        let base = ctx.resource::<OutputDir>()?.0.clone();
        let attempt = ctx.attempt();
        let written = tokio::task::spawn_blocking(move || {
            let dir = create_dirs(&base, &subdir)?;
            write_atomically(&dir, &name, &bytes, attempt).map(|path| (path, bytes.len()))
        })
        .await
        .map_err(|error| StepError::retryable(format!("file writer stopped: {error}")))?;
        let (path, bytes) = written
            .map_err(|error| StepError::retryable(format!("writing the file failed: {error}")))?;
        Ok(json!({ "path": path.display().to_string(), "bytes": bytes }))
    }
}

/// The file name made from `event_id` (without extension): bytes of
/// `[A-Za-z0-9._-]` as they are, every other byte as `%XX` (upper-case hex),
/// and a leading `.` as `%2E`. So a name is never empty, never `.` or `..`,
/// never hidden, never contains a separator, and two ids never share a name
/// (`%` itself is escaped).
///
/// Two more rules keep that true everywhere:
///
/// - **Case**: on a file system that ignores case (macOS, Windows by
///   default) `Evt_1` and `evt_1` would be one file. So an id with an
///   upper-case ASCII letter gets `%-` + the SHA-256 of the exact id (64 hex
///   digits) appended: names that differ only in case then differ in the
///   hash. Lower-case letters, digits and the escapes' upper-case hex never
///   make two names equal when case is ignored, so other ids keep their
///   plain name.
/// - **Length**: a name longer than [`MAX_STEM_BYTES`] is cut (never inside
///   a `%XX`) and gets the same `%-` + hash suffix.
///
/// `%-` never comes out of escaping, so a hashed name cannot collide with a
/// plain one.
///
/// ```
/// use tickmark_steps::write_file::file_name_for;
///
/// assert_eq!(file_name_for("evt_1n9.x-y"), "evt_1n9.x-y");
/// assert_eq!(file_name_for("../etc/passwd"), "%2E.%2Fetc%2Fpasswd");
/// assert_eq!(file_name_for("a b%"), "a%20b%25");
/// assert_eq!(file_name_for(""), "%");
/// // Upper case: the exact id's hash is appended.
/// let name = file_name_for("evt_1N9");
/// assert!(name.starts_with("evt_1N9%-") && name.len() == "evt_1N9".len() + 66);
/// assert_ne!(file_name_for("EVT_1n9").to_lowercase(), name.to_lowercase());
/// ```
pub fn file_name_for(event_id: &str) -> String {
    if event_id.is_empty() {
        // No id escapes to a lone `%`: it is a name of its own.
        return "%".to_owned();
    }
    let mut name = String::with_capacity(event_id.len());
    for (index, byte) in event_id.bytes().enumerate() {
        let plain = byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-');
        if plain && !(index == 0 && byte == b'.') {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    let has_upper_case = event_id.bytes().any(|b| b.is_ascii_uppercase());
    if name.len() <= MAX_STEM_BYTES && !has_upper_case {
        return name;
    }
    let mut keep = name.len().min(MAX_STEM_BYTES - HASH_SUFFIX_BYTES);
    // Never cut inside a `%XX`.
    while let Some(percent) = name[..keep].rfind('%') {
        if percent + 3 <= keep {
            break;
        }
        keep = percent;
    }
    name.truncate(keep);
    name.push_str("%-");
    name.push_str(&hex_digest(event_id.as_bytes()));
    name
}

fn hex_digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `subdir` as a relative path of plain names, or a terminal error.
fn checked_subdir(subdir: &str) -> Result<PathBuf, StepError> {
    let bad = || {
        StepError::terminal(format!(
            "subdir `{subdir}` must be `/`-separated names of [A-Za-z0-9._-], none empty or starting with `.`"
        ))
    };
    let mut path = PathBuf::new();
    for part in subdir.split('/') {
        let plain = !part.is_empty()
            && !part.starts_with('.')
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !plain {
            return Err(bad());
        }
        path.push(part);
    }
    // Belt and braces: only normal components.
    if !path.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(bad());
    }
    Ok(path)
}

/// Create `base/subdir` as needed, fsyncing the parent of every directory
/// created so that the new entries are durable too.
fn create_dirs(base: &Path, subdir: &Path) -> io::Result<PathBuf> {
    if !base.is_dir() {
        fs::create_dir_all(base)?;
        if let Some(parent) = base.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    let mut dir = base.to_path_buf();
    for part in subdir.components() {
        let parent = dir.clone();
        dir.push(part);
        match fs::create_dir(&dir) {
            Ok(()) => sync_dir(&parent)?,
            // An existing directory, not a link to one (`symlink_metadata`
            // does not follow links): files go nowhere someone else points.
            Err(error)
                if error.kind() == io::ErrorKind::AlreadyExists
                    && fs::symlink_metadata(&dir)?.file_type().is_dir() => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} exists and is not a directory (a symbolic link is not followed)",
                        dir.display()
                    ),
                ))
            }
            Err(error) => return Err(error),
        }
    }
    Ok(dir)
}

/// Write `bytes` to `dir/name` atomically (see the module documentation).
fn write_atomically(dir: &Path, name: &str, bytes: &[u8], attempt: u32) -> io::Result<PathBuf> {
    // What crashed earlier attempts may have left, this attempt's number
    // included (a release at shutdown gives the attempt back). Removing a
    // name removes a link, never what it points to.
    for earlier in attempt.saturating_sub(CLEANUP_ATTEMPTS)..=attempt {
        match fs::remove_file(dir.join(temp_name(name, earlier))) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
    }
    let target = dir.join(name);
    let temp = dir.join(temp_name(name, attempt));
    let result = (|| {
        let mut file = create_new_no_follow(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temp, &target)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result.map(|()| target)
}

/// Create `path` for writing: a new file (`O_CREAT | O_EXCL`: an existing
/// name, a symbolic link included, is an error, never opened or truncated),
/// and on unix with `O_NOFOLLOW` as well.
fn create_new_no_follow(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    options.open(path)
}

/// The temporary name of attempt `attempt` writing `name`.
fn temp_name(name: &str, attempt: u32) -> String {
    format!(".{name}.{attempt}.tmp")
}

/// Make a directory's entries durable (a rename, a new file). Windows has no
/// directory fsync; there, the rename itself is what we get.
fn sync_dir(dir: &Path) -> io::Result<()> {
    if cfg!(unix) {
        File::open(dir)?.sync_all()
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tickmark::{Resources, StepOutputs};

    use super::*;
    use crate::test_support::{context, event};

    #[test]
    fn plain_ids_are_kept() {
        for id in ["evt_1", "a.b-c_d", "x..y", "9", "0f1b8a3e-3c5f-4bd6"] {
            assert_eq!(file_name_for(id), id);
        }
    }

    /// An id with an upper-case letter keeps its text and gets the exact
    /// id's hash: ids that differ only in case never share a name on a file
    /// system that ignores case, nor collide with a plain name.
    #[test]
    fn names_differ_even_when_case_is_ignored() {
        let name = file_name_for("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W");
        assert_eq!(
            name,
            format!(
                "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W%-{}",
                hex_digest(b"msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
            )
        );
        let ids = [
            "evt_1n9", "evt_1N9", "EVT_1N9", "Evt_1n9", "a", "A", "%41", "a%2F", "A/", "é", "É",
            "ab", "aB", "Ab", "AB",
        ];
        let folded: Vec<String> = ids
            .iter()
            .map(|id| file_name_for(id).to_lowercase())
            .collect();
        let mut unique = folded.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "{folded:?}");
        // Long and upper-case: one suffix, within the limit.
        let long = "Ab".repeat(200);
        let name = file_name_for(&long);
        assert_eq!(name.len(), MAX_STEM_BYTES);
        assert_eq!(name.matches("%-").count(), 1);
    }

    #[test]
    fn paths_dots_and_separators_are_escaped() {
        assert_eq!(file_name_for("."), "%2E");
        assert_eq!(file_name_for(".."), "%2E.");
        assert_eq!(file_name_for("../x"), "%2E.%2Fx");
        assert_eq!(file_name_for("/etc/passwd"), "%2Fetc%2Fpasswd");
        assert_eq!(file_name_for("a\\b"), "a%5Cb");
        assert_eq!(file_name_for(".hidden"), "%2Ehidden");
        assert_eq!(
            file_name_for("C:x"),
            format!("C%3Ax%-{}", hex_digest(b"C:x"))
        );
        assert_eq!(file_name_for("50%"), "50%25");
        assert_eq!(file_name_for("é"), "%C3%A9");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(file_name_for("a\0b"), "a%00b");
        assert_eq!(file_name_for("line\nbreak\r\t"), "line%0Abreak%0D%09");
        assert_eq!(file_name_for("\x7f"), "%7F");
    }

    #[test]
    fn names_are_never_paths_and_never_collide() {
        let ids = [
            "", ".", "..", "...", "%2E", "%", "%25", "a/b", "a%2Fb", "a b", "a%20b", ".a", "%2Ea",
        ];
        let names: Vec<String> = ids.iter().map(|id| file_name_for(id)).collect();
        for name in &names {
            assert!(!name.is_empty() && name != "." && name != "..", "{name}");
            assert!(!name.starts_with('.'), "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-%".contains(&b)),
                "{name}"
            );
            let path = Path::new(name);
            assert_eq!(path.components().count(), 1, "{name}");
            assert!(matches!(
                path.components().next(),
                Some(Component::Normal(_))
            ));
        }
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }

    #[test]
    fn very_long_ids_are_cut_and_hashed() {
        let long = "x".repeat(1000);
        let name = file_name_for(&long);
        assert_eq!(name.len(), MAX_STEM_BYTES);
        assert!(name.starts_with("xxxx"));
        assert_eq!(&name[MAX_STEM_BYTES - 66..MAX_STEM_BYTES - 64], "%-");
        assert_ne!(file_name_for(&format!("{long}y")), name);

        // Exactly at the limit: kept whole.
        let limit = "y".repeat(MAX_STEM_BYTES);
        assert_eq!(file_name_for(&limit), limit);
        assert!(file_name_for(&format!("{limit}y")).contains("%-"));

        // Escapes are never cut in half.
        for pad in 0..3 {
            let id = format!("{}{}", "z".repeat(pad), "/".repeat(200));
            let name = file_name_for(&id);
            assert!(name.len() <= MAX_STEM_BYTES);
            let stem = name.split("%-").next().unwrap();
            assert_eq!((stem.len() - pad) % 3, 0, "{name}");
            assert!(stem[pad..].split('%').skip(1).all(|e| e == "2F"), "{name}");
        }
        // The temporary name stays under the usual 255-byte limit.
        let full = format!("{name}.{}", "e".repeat(MAX_EXTENSION_BYTES));
        assert!(temp_name(&full, u32::MAX).len() < 255);
    }

    #[test]
    fn subdirs_and_extensions_are_checked() {
        let step = |subdir: Option<&str>, ext: Option<&str>| WriteFile {
            content: ValueFrom::event(),
            subdir: subdir.map(str::to_owned),
            extension: ext.map(str::to_owned),
        };
        assert_eq!(
            step(Some("a/b-c"), Some("json"))
                .target("shop", "e")
                .unwrap(),
            (PathBuf::from("a/b-c/shop"), "e.json".to_owned())
        );
        assert_eq!(
            step(None, Some(".txt")).target("shop", "e").unwrap(),
            (PathBuf::from("shop"), "e.txt".to_owned())
        );
        // The source is one escaped component, never a path.
        assert_eq!(
            step(None, None).target("../x", "e").unwrap().0,
            PathBuf::from("%2E.%2Fx")
        );
        for bad in [
            "", "..", "a/../b", "/abs", "a//b", ".git", "a/", "a b", "a\\b",
        ] {
            assert!(
                step(Some(bad), None)
                    .target("s", "e")
                    .unwrap_err()
                    .is_terminal(),
                "{bad:?}"
            );
        }
        for bad in ["", ".", "j/s", "tar.gz", "x".repeat(17).as_str()] {
            assert!(
                step(None, Some(bad))
                    .target("s", "e")
                    .unwrap_err()
                    .is_terminal(),
                "{bad:?}"
            );
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_rewrite_replaces_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_atomically(dir.path(), "e.txt", b"first, longer", 1).unwrap();
        assert_eq!(path, dir.path().join("e.txt"));
        // A crashed attempt 2 left its temporary file behind.
        fs::write(dir.path().join(temp_name("e.txt", 2)), b"half").unwrap();
        write_atomically(dir.path(), "e.txt", b"second", 3).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(entries(dir.path()), ["e.txt"]);
    }

    /// A link planted at the temporary name is never written through: the
    /// temporary file is created new (the open refuses any existing name,
    /// a link included), and a write removes the link first.
    #[cfg(unix)]
    #[test]
    fn links_planted_in_the_directory_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        fs::write(&victim, b"keep me").unwrap();
        let temp = dir.path().join(temp_name("e.txt", 1));
        std::os::unix::fs::symlink(&victim, &temp).unwrap();
        // The open alone refuses the link (and a dangling one too).
        assert!(create_new_no_follow(&temp).is_err());
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(outside.path().join("nothing"), &dangling).unwrap();
        assert!(create_new_no_follow(&dangling).is_err());
        assert!(!outside.path().join("nothing").exists());
        // A write removes the planted link and writes its own file.
        write_atomically(dir.path(), "e.txt", b"mine", 1).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep me");
        assert_eq!(fs::read(dir.path().join("e.txt")).unwrap(), b"mine");
        // A link at the target name is replaced, not written through.
        fs::remove_file(dir.path().join("e.txt")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("e.txt")).unwrap();
        write_atomically(dir.path(), "e.txt", b"again", 2).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep me");
        assert!(!fs::symlink_metadata(dir.path().join("e.txt"))
            .unwrap()
            .file_type()
            .is_symlink());
        // A sub-directory that is a link is refused.
        std::os::unix::fs::symlink(outside.path(), dir.path().join("orders")).unwrap();
        assert!(create_dirs(dir.path(), Path::new("orders")).is_err());
        assert_eq!(entries(outside.path()), ["victim"]);
    }

    #[test]
    fn a_failed_write_removes_its_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // The target is a non-empty directory: the rename fails.
        fs::create_dir_all(dir.path().join("e.txt").join("inside")).unwrap();
        assert!(write_atomically(dir.path(), "e.txt", b"x", 1).is_err());
        assert_eq!(entries(dir.path()), ["e.txt"]);
    }

    #[tokio::test]
    async fn the_step_writes_under_the_output_dir() {
        let dir = tempfile::tempdir().unwrap();
        let event = event("../evt 1", json!({"total": 5}));
        let outputs = StepOutputs::default();
        let mut resources = Resources::default();
        resources.insert(OutputDir::new(dir.path().join("base")));
        let mut ctx = context(&event, "write", &outputs, &resources);

        let json_step = WriteFile::new(ValueFrom::event())
            .subdir("orders/2024")
            .extension("json");
        let output = json_step.run(&mut ctx).await.unwrap();
        let expected = dir.path().join("base/orders/2024/shop/%2E.%2Fevt%201.json");
        let content = fs::read_to_string(&expected).unwrap();
        assert_eq!(content, "{\n  \"total\": 5\n}\n");
        assert_eq!(
            output,
            json!({"path": expected.display().to_string(), "bytes": content.len()})
        );

        let text_step = WriteFile::new(ValueFrom::template("{kind} {event_id}\n"));
        text_step.run(&mut ctx).await.unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("base/shop/%2E.%2Fevt%201")).unwrap(),
            "order.paid ../evt 1\n"
        );
        // Run again: the same files, replaced.
        json_step.run(&mut ctx).await.unwrap();
        text_step.run(&mut ctx).await.unwrap();
        assert_eq!(entries(&dir.path().join("base")), ["orders", "shop"]);
        assert_eq!(entries(&dir.path().join("base/shop")), ["%2E.%2Fevt%201"]);
        assert_eq!(
            entries(&dir.path().join("base/orders/2024/shop")),
            ["%2E.%2Fevt%201.json"]
        );
    }

    #[tokio::test]
    async fn without_an_output_dir_the_step_is_retryable() {
        let event = event("e", json!({}));
        let outputs = StepOutputs::default();
        let resources = Resources::default();
        let mut ctx = context(&event, "write", &outputs, &resources);
        let error = WriteFile::new(ValueFrom::event())
            .run(&mut ctx)
            .await
            .unwrap_err();
        assert!(!error.is_terminal());
        assert!(error.message().contains("OutputDir"), "{error}");
    }

    #[test]
    fn the_stored_form() {
        let step: &dyn Step =
            &WriteFile::new(ValueFrom::output("render", "/html")).extension("html");
        assert_eq!(step.reads(), ["render"], "checked by Engine::new");
        assert!(WriteFile::new(ValueFrom::event()).reads().is_empty());
        assert_eq!(
            serde_json::to_value(step).unwrap(),
            json!({"type": "tickmark.write_file", "config": {
                "content": {"from": "output", "step": "render", "pointer": "/html"},
                "extension": "html",
            }})
        );
    }
}
