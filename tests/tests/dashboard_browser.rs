//! The dashboard in a real browser: headless Chromium (Debian's `chromium`,
//! installed by `scripts/setup`) loads an event page from the dashboard
//! served over a loopback socket, dumps its DOM and takes a screenshot.
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

use tickmark::dashboard::Dashboard;
use tickmark::{Backend, Engine, Handler, Handlers, NewEvent};
use tickmark_tests::conformance::{engine, quick_worker};
use tickmark_tests::http_client::LoopbackServer;
use tickmark_tests::test_steps::{Flaky, Record};
use tickmark_tests::TestDb;

const CHROMIUM: &str = "/usr/bin/chromium";
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

/// Run Chromium headless on `url` with `extra` arguments; its stdout.
async fn run_chromium(browser: &str, url: &str, extra: &[String]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut command = tokio::process::Command::new(browser);
    command
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
            // Take the picture once the page is fully laid out and painted.
            "--run-all-compositor-stages-before-draw",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size={WIDTH},{HEIGHT}"))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(90), command.output())
        .await
        .expect("chromium finished within 90 s")
        .expect("chromium started");
    assert!(
        output.status.success(),
        "chromium failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

async fn screenshot(browser: &str, url: &str, file: &Path) -> Image {
    run_chromium(browser, url, &[format!("--screenshot={}", file.display())]).await;
    if let Ok(dir) = std::env::var("TICKMARK_KEEP_SCREENSHOTS") {
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::copy(
            file,
            PathBuf::from(dir).join(file.file_name().expect("name")),
        );
    }
    Image::read(file)
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

/// The page's colours (engine/src/dashboard/html.rs).
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
        .run_until_idle()
        .await
        .expect("worker");

    let server =
        LoopbackServer::start(Dashboard::new(engine.clone()).token("t0k3n").router()).await;
    let seq = seq_of(&db, "evt_browser").await;
    let url = format!("http://{}/events/{seq}", server.addr);

    // The DOM, as the browser parsed it.
    let dom = run_chromium(browser, &url, &["--dump-dom".to_owned()]).await;
    let start = dom.find("id=\"steps\"").expect("the step table in the DOM");
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

    // The picture.
    let dir = tempfile::tempdir().expect("temp dir");
    let shot = screenshot(browser, &url, &dir.path().join("dashboard-event.png")).await;
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
    let control = screenshot(
        browser,
        &control_url,
        &dir.path().join("dashboard-no-steps.png"),
    )
    .await;
    assert_eq!((control.width, control.height), (WIDTH, HEIGHT));
    assert!(
        find_grid(&control, 10).is_none(),
        "the detector finds no step table where there is none"
    );
    // For a person to look at (TICKMARK_KEEP_SCREENSHOTS): the other pages.
    if std::env::var_os("TICKMARK_KEEP_SCREENSHOTS").is_some() {
        for (name, path) in [("overview", "/"), ("events", "/events")] {
            let url = format!("http://{}{path}", server.addr);
            let file = dir.path().join(format!("dashboard-{name}.png"));
            screenshot(browser, &url, &file).await;
        }
    }
    server.shutdown().await;
}
