//! The engine's layering, kept by a test: each top-level module of
//! `engine/src` sits in a layer (docs/architecture.md draws them) and may
//! import only modules of lower layers; and within a module, files import
//! each other without circles.
//!
//! It reads the source text: every `crate::…` path outside comments (in `use`
//! lines and in code), with names re-exported at the crate root (`crate::Engine`)
//! resolved to the module that defines them. Doc links are comments and do not
//! count: they are not dependencies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom first. A module may import modules of strictly lower layers.
const LAYERS: &[&[&str]] = &[
    // Leaves: no imports from the crate.
    &[
        "redact",
        "idempotency",
        "retry",
        "flow",
        "resources",
        "dedup_key",
        "outcome",
        "jitter",
        // What a reconcile run found, as stored with its cursor.
        "reconcile_summary",
        // The limits every accepted event meets (receiver and reconcile).
        "event_limits",
        // A signature's replay key (receiver and reconcile derive it alike).
        "replay_key",
        // A string that never prints (API keys in arguments and requests).
        "secret",
        // Serving a router within connection limits: knows HTTP, not events.
        "serve",
    ],
    // Records of an event's life; ordering rules and waits (they read keys
    // as flow does).
    &["event", "ordering", "wait"],
    // Storage: records, SQL, errors, decoding.
    &["store"],
    // What a running step sees; this process's counters; one event's status.
    &["context", "metrics", "event_status"],
    // The Step trait.
    &["step"],
    // Plans (steps as stored with an event), then handlers (plans per source and kind).
    &["plan"],
    &["handler"],
    // Accepting events; leases and the heartbeat.
    &["inbox", "claim"],
    // Running events.
    &["runner"],
    // Operator actions (re-planning plans as the inbox does); the engine,
    // which lends them its handlers.
    &["operator"],
    &["engine"],
    // The edges people and providers use; recovering from the providers'
    // APIs what they gave up on.
    &["receiver", "dashboard", "reconcile"],
    // The crate's error: every part's error converts into it.
    &["error"],
    &["ops", "cli"],
    // The test kit: drives engines and their workers as a user's tests would.
    &["testing"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read engine/src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The file's code: comments (line, doc, block) removed and the contents of
/// string literals blanked, so that neither is read as a path.
fn code_of(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let (mut in_string, mut escaped) = (false, false);
    while let Some(c) = chars.next() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            code.push(if in_string { ' ' } else { c });
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                code.push(c);
            }
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        code.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            _ => code.push(c),
        }
    }
    code
}

/// The first segment of every path after `prefix` (`crate::` or `super::`),
/// with `{a::b, c}` groups opened.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // part of a longer path, e.g. `super::super::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = matching_brace(group);
            for item in split_top_level(&group[..end]) {
                if let Some(name) = first_segment(item.trim()) {
                    found.push(name);
                }
            }
        } else if let Some(name) = first_segment(rest) {
            found.push(name);
        }
    }
    found
}

fn matching_brace(text: &str) -> usize {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn first_segment(path: &str) -> Option<String> {
    let name: String = path
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty() && name != "self").then_some(name)
}

/// Names the crate root re-exports (`pub use engine::Engine;`), by the module
/// that defines them.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in code_of(lib).split(';') {
        let statement = statement.trim();
        let Some(path) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let Some((module, items)) = path.split_once("::") else {
            continue;
        };
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in split_top_level(items) {
            let item = item.trim();
            let name = item.rsplit("::").next().unwrap_or(item);
            let name = name.rsplit(" as ").next().unwrap_or(name).trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    names
}

/// The top-level module a file belongs to (`store/postgres/mod.rs` → `store`),
/// or `None` for the crate root and binaries.
fn module_of(file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src()).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "bin" => None,
        _ => Some(first.trim_end_matches(".rs").to_owned()),
    }
}

/// (importing module, imported module, file) for every cross-module import.
fn module_imports() -> Vec<(String, String, PathBuf)> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let reexports = root_reexports(&lib);
    let mut imports = Vec::new();
    for file in rust_files(&src()) {
        let Some(module) = module_of(&file) else {
            continue;
        };
        let code = code_of(&std::fs::read_to_string(&file).expect("read"));
        for name in paths_after(&code, "crate::") {
            let target = reexports.get(&name).cloned().unwrap_or(name);
            if target != module {
                imports.push((module.clone(), target, file.clone()));
            }
        }
    }
    imports
}

#[test]
fn every_module_has_a_layer() {
    let missing: BTreeSet<String> = rust_files(&src())
        .iter()
        .filter_map(|file| module_of(file))
        .filter(|module| layer_of(module).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "modules with no layer in tests/layering.rs (and docs/architecture.md): {missing:?}"
    );
}

#[test]
fn no_module_imports_one_above_it_or_beside_it() {
    let wrong: Vec<String> = module_imports()
        .into_iter()
        .filter_map(|(from, to, file)| {
            let (Some(from_layer), Some(to_layer)) = (layer_of(&from), layer_of(&to)) else {
                return None; // every_module_has_a_layer reports these
            };
            (to_layer >= from_layer).then(|| {
                format!(
                    "{} (layer {from_layer}) imports `{to}` (layer {to_layer})",
                    file.strip_prefix(src()).unwrap_or(&file).display()
                )
            })
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "imports against the layering of docs/architecture.md:\n{}",
        wrong.join("\n")
    );
}

/// Within one module's folder, which sibling files each file imports
/// (`super::name`, or a name its `mod.rs` re-exports from a sibling).
fn sibling_imports(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read module dir")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .collect();
    let stem = |path: &Path| {
        path.file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned()
    };
    let siblings: BTreeSet<String> = files
        .iter()
        .map(|path| stem(path))
        .chain(
            std::fs::read_dir(dir)
                .expect("read module dir")
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|path| path.is_dir())
                .map(|path| stem(&path)),
        )
        .filter(|name| name != "mod")
        .collect();
    let mod_rs = std::fs::read_to_string(dir.join("mod.rs")).unwrap_or_default();
    let reexports = root_reexports(&mod_rs);
    let mut graph = BTreeMap::new();
    for file in &files {
        let name = stem(file);
        if name == "mod" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(file).expect("read"));
        let targets: BTreeSet<String> = paths_after(&code, "super::")
            .into_iter()
            .filter_map(|used| {
                if siblings.contains(&used) {
                    Some(used)
                } else {
                    reexports.get(&used).cloned()
                }
            })
            .filter(|target| *target != name)
            .collect();
        graph.insert(name, targets);
    }
    graph
}

fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn files_within_a_module_import_each_other_without_circles() {
    let mut circles = Vec::new();
    let mut pending = vec![src()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            }
        }
        if dir != src() {
            if let Some(cycle) = find_cycle(&sibling_imports(&dir)) {
                circles.push(format!(
                    "{}: {}",
                    dir.strip_prefix(src()).unwrap_or(&dir).display(),
                    cycle.join(" → ")
                ));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// The checker itself: an upward import is seen, in a `use` group and in code.
#[test]
fn the_checker_sees_grouped_and_inline_paths_but_not_comments() {
    let code = code_of(
        "use crate::{store::{Lease, Store}, event::Event};\n\
         /// [`Engine`](crate::engine::Engine)\n\
         fn f() { crate::runner::go(\"crate::cli\"); } // crate::ops\n",
    );
    let mut found = paths_after(&code, "crate::");
    found.sort();
    assert_eq!(found, ["event", "runner", "store"]);
}
