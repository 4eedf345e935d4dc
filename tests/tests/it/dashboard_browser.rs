//! The dashboard in a real browser: headless Chromium (Debian's `chromium`,
//! installed by `scripts/setup`), driven over the DevTools protocol, opens an
//! event page of the dashboard served over a loopback socket, is shown the
//! login form (401), signs in by typing the token into it and pressing
//! Enter, lands on the event page, reads its DOM and takes a screenshot.
//! Over the same real sockets, every page and `/metrics` answer 401 without
//! the token and 200 with it, and a hostile payload and error render inert
//! (no script or image element in the browser's DOM; the text shown as
//! typed).
//!
//! The DOM must contain every step's name, state and idempotency key. The
//! screenshot must be a PNG of the window's size that is not one flat colour
//! and that shows the step table. "Shows the table" is checked on pixels,
//! without fonts or exact layout entering in: the step table is the only
//! grid on the page — a band between two long horizontal 1-px border lines
//! (the table's border colour, spanning most of the window) crossed by at
//! least as many vertical border segments as the header has columns — whose
//! rows hold dark text pixels and the state colours (green `done` badges,
//! a red `dead` badge, the tinted failure row). The same detector run on the
//! page of an event without steps must find no grid, so it cannot pass on
//! the page's chrome alone.
//!
//! Without `/usr/bin/chromium` the test skips with a message, or fails when
//! `CI=true`. `TICKMARK_KEEP_SCREENSHOTS=DIR` copies the screenshots there.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tickmark::dashboard::Dashboard;
use tickmark::{
    Backend, Engine, Handler, Handlers, NewEvent, Step, StepContext, StepError, StepResult,
};
use tickmark_tests::conformance::{engine, quick_worker};
use tickmark_tests::http_client::{HttpClient, LoopbackServer, Outgoing};
use tickmark_tests::test_steps::{Flaky, Record};
use tickmark_tests::TestDb;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const CHROMIUM: &str = "/usr/bin/chromium";
const TOKEN: &str = "browser-test-token-0123456789";
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 900;
const STEPS: [(&str, &str); 3] = [
    ("reserve_stock", "done"),
    ("charge_card", "done"),
    ("send_receipt", "dead"),
];

/// Chromium, or `None` when the test should skip.
fn chromium() -> Option<&'static str> {
    if Path::new(CHROMIUM).exists() {
        return Some(CHROMIUM);
    }
    // Records the skip for scripts/test; under CI=true it fails the test instead.
    tickmark_tests::skip::record(
        &tickmark_tests::skip::current_test(),
        &format!("{CHROMIUM} is missing: run scripts/setup (installs Debian's chromium package)"),
    );
    None
}

/// Headless Chromium driven over the DevTools protocol on a pipe
/// (`--remote-debugging-pipe`: the browser reads commands from fd 3 and
/// writes replies and events to fd 4, each a JSON text ended by a NUL). A
/// shell maps fds 3 and 4 onto the child's stdin and stdout, so no `unsafe`
/// file-descriptor juggling is needed here; Chromium's own output goes to a
/// log file shown on failure.
struct Browser {
    child: tokio::process::Child,
    commands: tokio::process::ChildStdin,
    replies: tokio::io::BufReader<tokio::process::ChildStdout>,
    next_id: u64,
    /// Events read while waiting for a reply, not yet waited for.
    events: Vec<Value>,
    log: PathBuf,
    _profile: tempfile::TempDir,
}

/// One tab of the browser: the DevTools session attached to it.
struct Tab {
    session: String,
}

impl Browser {
    async fn launch(binary: &str) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let log = profile.path().join("chromium.log");
        let mut command = tokio::process::Command::new("sh");
        command
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 </dev/null >&2"#)
            .arg(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                // Pixel-exact borders and no scrollbar in the picture.
                "--force-device-scale-factor=1",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--window-size={WIDTH},{HEIGHT}"))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .kill_on_drop(true);
        let mut child = command.spawn().expect("chromium started");
        Browser {
            commands: child.stdin.take().expect("fd 3"),
            replies: tokio::io::BufReader::new(child.stdout.take().expect("fd 4")),
            child,
            next_id: 0,
            events: Vec::new(),
            log,
            _profile: profile,
        }
    }

    /// What Chromium logged, for failure messages.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The next message from the browser; 60 s is far beyond any answer on
    /// a loaded 2-core machine: hitting it means the browser is stuck.
    async fn read(&mut self) -> Value {
        let mut message = Vec::new();
        let read = tokio::time::timeout(
            Duration::from_secs(60),
            self.replies.read_until(0, &mut message),
        )
        .await
        .unwrap_or_else(|_| panic!("chromium answered within 60 s; its log:\n{}", self.log()))
        .expect("read from chromium");
        assert!(
            read > 0,
            "chromium closed the pipe; its log:\n{}",
            self.log()
        );
        message.pop();
        serde_json::from_slice(&message).expect("a DevTools message is JSON")
    }

    /// Send `method` (to `session`, or the browser) and wait for its result.
    async fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = serde_json::json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = session.into();
        }
        let mut bytes = serde_json::to_vec(&message).expect("JSON");
        bytes.push(0);
        self.commands
            .write_all(&bytes)
            .await
            .expect("write to chromium");
        loop {
            let reply = self.read().await;
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
            if reply.get("method").is_some() {
                self.events.push(reply);
            }
        }
    }

    /// Wait for the event `method` from `session`.
    async fn event(&mut self, session: &str, method: &str) -> Value {
        let wanted =
            |message: &Value| message["method"] == method && message["sessionId"] == session;
        if let Some(at) = self.events.iter().position(wanted) {
            return self.events.remove(at);
        }
        loop {
            let message = self.read().await;
            if wanted(&message) {
                return message;
            }
            if message.get("method").is_some() {
                self.events.push(message);
            }
        }
    }

    /// A new tab of the window's size, its page events on.
    async fn tab(&mut self) -> Tab {
        let target = self
            .call(
                None,
                "Target.createTarget",
                serde_json::json!({ "url": "about:blank" }),
            )
            .await;
        let attached = self
            .call(
                None,
                "Target.attachToTarget",
                serde_json::json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        let tab = Tab {
            session: attached["sessionId"]
                .as_str()
                .expect("session id")
                .to_owned(),
        };
        self.call(Some(&tab.session), "Page.enable", serde_json::json!({}))
            .await;
        self.call(
            Some(&tab.session),
            "Emulation.setDeviceMetricsOverride",
            serde_json::json!({
                "width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": false
            }),
        )
        .await;
        tab
    }

    /// Open `url` in `tab` and wait until it has loaded.
    async fn open(&mut self, tab: &Tab, url: &str) {
        self.events
            .retain(|event| event["method"] != "Page.loadEventFired");
        let navigated = self
            .call(
                Some(&tab.session),
                "Page.navigate",
                serde_json::json!({ "url": url }),
            )
            .await;
        assert!(navigated.get("errorText").is_none(), "{url}: {navigated}");
        self.event(&tab.session, "Page.loadEventFired").await;
    }

    /// The node id of the document.
    async fn document(&mut self, tab: &Tab) -> Value {
        self.call(
            Some(&tab.session),
            "DOM.getDocument",
            serde_json::json!({ "depth": 0 }),
        )
        .await["root"]["nodeId"]
            .clone()
    }

    /// The page's DOM, serialised as the browser holds it.
    async fn dom(&mut self, tab: &Tab) -> String {
        let root = self.document(tab).await;
        self.call(
            Some(&tab.session),
            "DOM.getOuterHTML",
            serde_json::json!({ "nodeId": root }),
        )
        .await["outerHTML"]
            .as_str()
            .expect("outer HTML")
            .to_owned()
    }

    /// How many elements match `selector` in the page.
    async fn count(&mut self, tab: &Tab, selector: &str) -> usize {
        let root = self.document(tab).await;
        self.call(
            Some(&tab.session),
            "DOM.querySelectorAll",
            serde_json::json!({ "nodeId": root, "selector": selector }),
        )
        .await["nodeIds"]
            .as_array()
            .map_or(0, Vec::len)
    }

    /// Type `text` into the field `selector` and press Enter, as a person
    /// submits a form; wait for the page it leads to.
    async fn submit(&mut self, tab: &Tab, selector: &str, text: &str) {
        let root = self.document(tab).await;
        let field = self
            .call(
                Some(&tab.session),
                "DOM.querySelector",
                serde_json::json!({ "nodeId": root, "selector": selector }),
            )
            .await["nodeId"]
            .clone();
        assert_ne!(field, 0, "no {selector} on the page");
        self.events
            .retain(|event| event["method"] != "Page.loadEventFired");
        self.call(
            Some(&tab.session),
            "DOM.focus",
            serde_json::json!({ "nodeId": field }),
        )
        .await;
        self.call(
            Some(&tab.session),
            "Input.insertText",
            serde_json::json!({ "text": text }),
        )
        .await;
        for kind in ["keyDown", "keyUp"] {
            self.call(
                Some(&tab.session),
                "Input.dispatchKeyEvent",
                serde_json::json!({
                    "type": kind, "key": "Enter", "code": "Enter",
                    "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13, "text": "\r"
                }),
            )
            .await;
        }
        self.event(&tab.session, "Page.loadEventFired").await;
    }

    /// A screenshot of the tab, decoded (and kept with
    /// `TICKMARK_KEEP_SCREENSHOTS`).
    async fn screenshot(&mut self, tab: &Tab, file: &Path) -> Image {
        let shot = self
            .call(
                Some(&tab.session),
                "Page.captureScreenshot",
                serde_json::json!({ "format": "png" }),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("PNG data"))
            .expect("base64 PNG");
        std::fs::write(file, png).expect("write the screenshot");
        if let Ok(dir) = std::env::var("TICKMARK_KEEP_SCREENSHOTS") {
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::copy(
                file,
                PathBuf::from(dir).join(file.file_name().expect("name")),
            );
        }
        Image::read(file)
    }

    async fn close(mut self) {
        let _ = self
            .call(None, "Browser.close", serde_json::json!({}))
            .await;
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }
}

/// A decoded RGB screenshot.
struct Image {
    width: u32,
    height: u32,
    rgb: Vec<[u8; 3]>,
}

impl Image {
    fn read(file: &Path) -> Image {
        let decoder = png::Decoder::new(std::io::BufReader::new(
            std::fs::File::open(file).expect("screenshot written"),
        ));
        let mut reader = decoder.read_info().expect("a valid PNG");
        let mut buffer = vec![0; reader.output_buffer_size().expect("size")];
        let info = reader.next_frame(&mut buffer).expect("a PNG frame");
        assert_eq!(info.bit_depth, png::BitDepth::Eight, "8-bit PNG");
        let channels = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => panic!("unexpected PNG colour type {other:?}"),
        };
        let rgb = buffer[..info.buffer_size()]
            .chunks_exact(channels)
            .map(|px| [px[0], px[1], px[2]])
            .collect();
        Image {
            width: info.width,
            height: info.height,
            rgb,
        }
    }

    fn at(&self, x: u32, y: u32) -> [u8; 3] {
        self.rgb[(y * self.width + x) as usize]
    }

    fn is(&self, x: u32, y: u32, colour: [u8; 3]) -> bool {
        let px = self.at(x, y);
        (0..3).all(|i| px[i].abs_diff(colour[i]) <= 6)
    }

    fn distinct_colours(&self) -> usize {
        let mut colours: Vec<[u8; 3]> = self.rgb.clone();
        colours.sort_unstable();
        colours.dedup();
        colours.len()
    }
}

/// The page's colours (crates/tickmark-dashboard/src/html.rs).
const BORDER: [u8; 3] = [0xd0, 0xd7, 0xde];
const DONE_BADGE: [u8; 3] = [0xda, 0xfb, 0xe1];
const DEAD_BADGE: [u8; 3] = [0xff, 0xeb, 0xe9];
const FAIL_ROW: [u8; 3] = [0xff, 0xf5, 0xf5];

/// A grid found in a screenshot: the rows between its horizontal lines.
#[derive(Debug)]
struct Grid {
    /// y of each horizontal border line, top to bottom.
    lines: Vec<u32>,
    /// Vertical border segments crossing the header row.
    header_columns: usize,
}

/// Find the step table: long horizontal border lines (each over 70 % of
/// the width); a band between two of them that is crossed by at least
/// `min_columns` vertical border segments (the header row), and the bands
/// below it that still have the table's left and right borders (its rows).
/// `None` when there is no such grid.
fn find_grid(image: &Image, min_columns: usize) -> Option<Grid> {
    let mut long: Vec<u32> = (0..image.height)
        .filter(|&y| {
            let border = (0..image.width).filter(|&x| image.is(x, y, BORDER)).count();
            border * 10 > image.width as usize * 7
        })
        .collect();
    // Adjacent pixel rows (a 2-px line) count once.
    long.dedup_by(|b, a| *b - *a <= 1);
    let band = |i: usize| vertical_segments(image, long[i] + 2, long[i + 1].saturating_sub(1));
    let header = (0..long.len().saturating_sub(1)).find(|&i| band(i) >= min_columns)?;
    let mut last = header + 1;
    while last + 1 < long.len() && band(last) >= 2 {
        last += 1;
    }
    Some(Grid {
        lines: long[header..=last].to_vec(),
        header_columns: band(header),
    })
}

/// How many x positions are border-coloured over the whole band `top..bottom`.
fn vertical_segments(image: &Image, top: u32, bottom: u32) -> usize {
    if bottom <= top {
        return 0;
    }
    let mut xs: Vec<u32> = (0..image.width)
        .filter(|&x| (top..bottom).all(|y| image.is(x, y, BORDER)))
        .collect();
    xs.dedup_by(|b, a| *b - *a <= 1);
    xs.len()
}

/// Pixels in rows `top..bottom` that stand out from the band's most common
/// colour (its background) and are not border: text, badges.
fn ink_in(image: &Image, top: u32, bottom: u32) -> usize {
    let pixels: Vec<(u32, u32)> = (top..bottom)
        .flat_map(|y| (0..image.width).map(move |x| (x, y)))
        .collect();
    let mut colours: Vec<[u8; 3]> = pixels.iter().map(|&(x, y)| image.at(x, y)).collect();
    colours.sort_unstable();
    let background = colours
        .chunk_by(|a, b| a == b)
        .max_by_key(|run| run.len())
        .map(|run| run[0])
        .unwrap_or([255; 3]);
    pixels
        .into_iter()
        .filter(|&(x, y)| {
            let px = image.at(x, y);
            let distance: u32 = (0..3)
                .map(|i| u32::from(px[i].abs_diff(background[i])))
                .sum();
            distance > 90 && !image.is(x, y, BORDER)
        })
        .count()
}

fn count_in(image: &Image, top: u32, bottom: u32, colour: [u8; 3]) -> usize {
    (top..bottom)
        .flat_map(|y| (0..image.width).map(move |x| (x, y)))
        .filter(|&(x, y)| image.is(x, y, colour))
        .count()
}

async fn seq_of(db: &TestDb, id: &str) -> i64 {
    db.store
        .event_find("shop", id)
        .await
        .expect("find")
        .expect("accepted")
        .event
        .seq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_page_in_chromium_shows_its_step_table() {
    let Some(browser) = chromium() else { return };
    let db = TestDb::new(Backend::Sqlite).await.expect("SQLite");
    let handlers = Handlers::new()
        .on(
            "shop",
            "order.hostile",
            Handler::new().named_step("explode", HostileError),
        )
        .on(
            "shop",
            "order.shipped",
            Handler::new().named_step("notify", Record::default()),
        )
        .on(
            "shop",
            "order.paid",
            Handler::new()
                .named_step("reserve_stock", Record::default())
                .named_step("charge_card", Record::default())
                .named_step(
                    "send_receipt",
                    Flaky {
                        fail_first: 99,
                        terminal: true,
                    },
                ),
        );
    let engine: Engine = engine(&db, handlers);
    let payload = serde_json::json!({ "order": "ord_1842", "amount": 4200, "currency": "eur" });
    engine
        .accept(NewEvent::with_id(
            "shop",
            "evt_browser",
            "order.paid",
            payload,
        ))
        .await
        .expect("accept");
    // A finished event, for the overview's chart.
    engine
        .accept(NewEvent::with_id(
            "shop",
            "evt_shipped",
            "order.shipped",
            serde_json::json!({}),
        ))
        .await
        .expect("accept");
    // Markup in a payload and (from its step) in an error.
    engine
        .accept(NewEvent::with_id(
            "shop",
            "evt_hostile",
            "order.hostile",
            serde_json::json!({
                "note": "<script>alert(\"payload\")</script>",
                "attr": "</pre><img src=x onerror=alert(1)>",
            }),
        ))
        .await
        .expect("accept");
    // An event without steps (no handler for its kind): the control page.
    engine
        .accept(NewEvent::with_id(
            "shop",
            "evt_no_steps",
            "order.unknown",
            serde_json::json!({ "order": "ord_1843" }),
        ))
        .await
        .expect("accept");
    engine
        .worker(quick_worker("browser-test"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .expect("worker");

    let server = LoopbackServer::start(tickmark::ops::router(
        engine.clone(),
        Some(Dashboard::new(engine.clone()).token(TOKEN)),
    ))
    .await;
    let seq = seq_of(&db, "evt_browser").await;
    let hostile_seq = seq_of(&db, "evt_hostile").await;
    every_page_needs_the_token(server.addr, &[seq, hostile_seq]).await;
    let url = format!("http://{}/events/{seq}", server.addr);

    // Without the token: the login form, and nothing of the event.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut chrome = Browser::launch(browser).await;
    let tab = chrome.tab().await;
    chrome.open(&tab, &url).await;
    let login = chrome.dom(&tab).await;
    assert!(
        !login.contains("id=\"steps\""),
        "no step table before signing in"
    );
    assert!(
        !login.contains("evt_browser"),
        "nothing of the event before signing in"
    );
    assert_eq!(
        chrome.count(&tab, "input[type=password][name=token]").await,
        1,
        "{login}"
    );
    if std::env::var_os("TICKMARK_KEEP_SCREENSHOTS").is_some() {
        chrome
            .screenshot(&tab, &dir.path().join("dashboard-login.png"))
            .await;
    }

    // Sign in as a person does: type the token, press Enter. The form posts
    // it, the session cookie is set, and the browser is sent to the page.
    chrome.submit(&tab, "input[name=token]", TOKEN).await;

    // The DOM, as the browser parsed it.
    let dom = chrome.dom(&tab).await;
    let start = dom.find("id=\"steps\"").unwrap_or_else(|| {
        panic!(
            "the step table in the DOM after signing in:\n{dom}\n{}",
            chrome.log()
        )
    });
    let table = &dom[start..start + dom[start..].find("</table>").expect("table end")];
    for (step, state) in STEPS {
        assert!(
            table.contains(&format!("<td>{step}</td>")),
            "{step} in\n{table}"
        );
        assert!(
            table.contains(&format!("<span class=\"state s-{state}\">{state}</span>")),
            "{step}'s state {state} in\n{table}"
        );
        assert!(
            table.contains(&format!("shop:evt_browser:{step}")),
            "{step}'s key"
        );
    }
    assert_eq!(
        chrome.count(&tab, "form[action=\"/logout\"]").await,
        1,
        "signed in: the sign-out button"
    );

    // The picture.
    let shot = chrome
        .screenshot(&tab, &dir.path().join("dashboard-event.png"))
        .await;
    assert_eq!(
        (shot.width, shot.height),
        (WIDTH, HEIGHT),
        "the window's size"
    );
    assert!(
        shot.distinct_colours() > 50,
        "not one flat colour: {} colours",
        shot.distinct_colours()
    );
    let grid = find_grid(&shot, 10).expect("a step table with its 10 columns in the screenshot");
    let (top, bottom) = (grid.lines[0], *grid.lines.last().expect("lines"));
    assert!(grid.header_columns >= 10, "the header's column borders");
    assert!(
        grid.lines.len() > STEPS.len(),
        "a line above the header and below each step row: {grid:?}"
    );
    // Text in every row band (between consecutive lines): pixels far from
    // the band's own background colour, borders aside.
    for band in grid.lines.windows(2) {
        let ink = ink_in(&shot, band[0] + 1, band[1]);
        assert!(
            ink > 40,
            "text in the row between y={} and y={}: {ink} px",
            band[0],
            band[1]
        );
    }
    assert!(
        count_in(&shot, top, bottom, DONE_BADGE) > 100,
        "green done badges"
    );
    assert!(
        count_in(&shot, top, bottom, DEAD_BADGE) > 50,
        "a red dead badge"
    );
    assert!(
        count_in(&shot, top, bottom, FAIL_ROW) > 1000,
        "the failure row tinted"
    );
    eprintln!("step table found at y={top}..{bottom}: {grid:?}");

    // The control: the same page for an event without steps has no grid.
    let control_seq = seq_of(&db, "evt_no_steps").await;
    let control_url = format!("http://{}/events/{control_seq}", server.addr);
    chrome.open(&tab, &control_url).await;
    let control = chrome
        .screenshot(&tab, &dir.path().join("dashboard-no-steps.png"))
        .await;
    assert_eq!((control.width, control.height), (WIDTH, HEIGHT));
    assert!(
        find_grid(&control, 10).is_none(),
        "the detector finds no step table where there is none"
    );

    // A payload and an error full of markup render inert: the browser
    // builds no script or image element from them and shows the text as
    // it was sent.
    chrome
        .open(
            &tab,
            &format!("http://{}/events/{hostile_seq}", server.addr),
        )
        .await;
    assert_eq!(
        chrome.count(&tab, "script, img, iframe, [onerror]").await,
        0
    );
    let dom = chrome.dom(&tab).await;
    for shown in [
        "&lt;script&gt;alert(\\\"payload\\\")&lt;/script&gt;",
        "&lt;/pre&gt;&lt;img src=x onerror=alert(1)&gt;",
        "&lt;script&gt;alert('error')&lt;/script&gt;",
    ] {
        assert!(dom.contains(shown), "{shown} in\n{dom}");
    }

    // For a person to look at (TICKMARK_KEEP_SCREENSHOTS): the other pages.
    if std::env::var_os("TICKMARK_KEEP_SCREENSHOTS").is_some() {
        for (name, path) in [
            ("overview", "/".to_owned()),
            ("events", "/events".to_owned()),
            ("hostile", format!("/events/{hostile_seq}")),
        ] {
            chrome
                .open(&tab, &format!("http://{}{path}", server.addr))
                .await;
            let file = dir.path().join(format!("dashboard-{name}.png"));
            chrome.screenshot(&tab, &file).await;
        }
    }
    chrome.close().await;
    server.shutdown().await;
}

/// Over real sockets: every page and `/metrics` answer 401 without the
/// token (or with a wrong one) and 200 with it.
async fn every_page_needs_the_token(addr: std::net::SocketAddr, events: &[i64]) {
    let client = HttpClient::new();
    let mut paths = vec![
        "/".to_owned(),
        "/events".to_owned(),
        "/events?state=dead".to_owned(),
        "/metrics".to_owned(),
    ];
    paths.extend(events.iter().map(|seq| format!("/events/{seq}")));
    for path in &paths {
        for credentials in [None, Some("wrong-token")] {
            let mut request = Outgoing::get(path.as_str());
            if let Some(token) = credentials {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            let reply = client.send(addr, &request).await.expect("a reply");
            assert_eq!(reply.status, 401, "{path} with {credentials:?}");
        }
        let reply = client
            .send(
                addr,
                &Outgoing::get(path.as_str()).header("authorization", format!("Bearer {TOKEN}")),
            )
            .await
            .expect("a reply");
        assert_eq!(reply.status, 200, "{path} with the token");
    }
}

/// A step that fails terminally with markup in its error.
#[derive(Debug, Serialize, Deserialize)]
struct HostileError;

#[typetag::serde(name = "browser_test_hostile_error")]
#[async_trait::async_trait]
impl Step for HostileError {
    async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
        Err(StepError::terminal("<script>alert('error')</script>"))
    }
}
