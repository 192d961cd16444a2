//! End to end in a real headless Chromium driven over WebDriver (Debian's `chromium` and
//! `chromium-driver`, installed by `scripts/test.sh`): the demo runs as a process, the browser
//! applies filters from the filter bar, follows a drill-down to a GPU, and every number checked
//! on a page must equal the query API's for the same filter. Screenshots of every page go to
//! `target/screenshots/` (or `$GPULEDGER_SCREENSHOTS`), and the folder is printed.
//!
//! Without chromedriver on PATH the test says it was skipped, unless `GPULEDGER_REQUIRE_BROWSER`
//! is set (the README's test command sets it), in which case it fails.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use serde_json::{json, Value};

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `12,345` as the pages print counts.
fn count(v: i64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn usd(v: f64) -> String {
    let cents = (v * 100.0).round() as i64;
    format!("${}.{:02}", count(cents / 100), cents % 100)
}

async fn api(base: &str, path: &str) -> Value {
    reqwest::get(format!("{base}{path}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn text(c: &fantoccini::Client, css: &str) -> String {
    c.wait()
        .for_element(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn browser_filters_and_drill_down_match_the_api() {
    let Some(driver) = which("chromedriver") else {
        if std::env::var_os("GPULEDGER_REQUIRE_BROWSER").is_some() {
            panic!("chromedriver is not on PATH; install Debian's chromium and chromium-driver");
        }
        eprintln!("skipped: browser end-to-end test (no chromedriver on PATH; scripts/test.sh installs it)");
        return;
    };
    let shots = std::env::var_os("GPULEDGER_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/screenshots")
        });
    std::fs::create_dir_all(&shots).unwrap();
    let work = std::env::temp_dir().join(format!("gpuledger-browser-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();

    // The demo, as the README runs it, with a shorter history (ten days: enough for a forecast).
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args([
            "demo",
            "--days",
            "10",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
        ])
        .arg(work.join("demo.db"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _demo = Kill(child);
    let mut base = String::new();
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(url) = line.strip_prefix("dashboard:") {
            base = url.trim().trim_end_matches('/').to_string();
            break;
        }
    }
    // Keep reading: the demo prints more lines after the URL, and a closed pipe would make
    // its next print fail and the demo exit (the page then refuses connections).
    std::thread::spawn(move || lines.for_each(drop));
    assert!(
        base.starts_with("http://127.0.0.1:"),
        "demo did not print its URL"
    );

    let port = free_port();
    let _driver = Kill(
        Command::new(driver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let webdriver = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if reqwest::get(format!("{webdriver}/status")).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": which("chromium").map(|p| p.display().to_string()).unwrap_or_else(|| "/usr/bin/chromium".into()),
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                     "--window-size=1440,1100", format!("--user-data-dir={}", work.join("chrome").display())]
        }),
    );
    let c = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&webdriver)
        .await
        .expect("start a Chromium session through chromedriver");

    let shot = |name: &'static str| {
        let c = c.clone();
        let path = shots.join(format!("{name}.png"));
        async move {
            let png = c.screenshot().await.unwrap();
            std::fs::write(&path, png).unwrap();
        }
    };

    // Three filters applied from the filter bar: the page's totals equal the API's.
    for (filter, value) in [
        ("team", "nlp"),
        ("env", "prod"),
        ("cloud", "aws"),
        ("vendor", "amd"),
    ] {
        for attempt in 0..2 {
            c.goto(&format!("{base}/")).await.unwrap();
            let select = c
                .wait()
                .for_element(Locator::Id(&format!("filter-{filter}")))
                .await
                .unwrap();
            select.select_by_value(value).await.unwrap();
            c.find(Locator::Id("apply-filters"))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
            for _ in 0..100 {
                if c.current_url()
                    .await
                    .unwrap()
                    .as_str()
                    .contains(&format!("{filter}={value}"))
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let page_cost = text(&c, "#cost").await;
            let page_hours = text(&c, "#gpu-hours").await;
            let page_idle = text(&c, "#idle-cost").await;
            let s = api(&base, &format!("/api/v1/summary?{filter}={value}")).await;
            let t = &s["total"];
            let want = (
                usd(t["cost_usd"].as_f64().unwrap()),
                count(t["gpu_hours"].as_i64().unwrap()),
                usd(t["idle_cost_usd"].as_f64().unwrap()),
            );
            // The demo imports a billing export of its AWS hosts' complete days: the cost card
            // says what was billed for which hours, as the API does.
            let page_basis = text(&c, "#cost-basis").await;
            let want_basis = match t["cost_basis"].as_str() {
                Some("estimate") => "estimate: no billing export covers the range".to_string(),
                _ => format!(
                    "{}: billed {} for {} of {} GPU-hours (estimated {} for those)",
                    t["cost_basis"].as_str().unwrap().replace('_', " "),
                    usd(t["billed_usd"].as_f64().unwrap()),
                    count(t["billed_gpu_hours"].as_i64().unwrap()),
                    count(t["gpu_hours"].as_i64().unwrap()),
                    usd(t["billed_estimate_usd"].as_f64().unwrap()),
                ),
            };
            if filter == "cloud" {
                assert_eq!(t["cost_basis"], "partly_reconciled", "{t}");
            }
            if (page_cost.clone(), page_hours.clone(), page_idle.clone()) == want
                && page_basis == want_basis
            {
                eprintln!("filter {filter}={value}: page and API agree: cost {page_cost}, GPU-hours {page_hours}, idle cost {page_idle}; {page_basis}");
                break;
            }
            // The clock may have crossed an hour between the page and the API call; once more.
            assert_eq!(
                attempt, 0,
                "{filter}={value}: page ({page_cost}, {page_hours}, {page_idle}, {page_basis}) != \
                 API {want:?}, {want_basis}"
            );
        }
        if filter == "team" {
            shot("overview-team-nlp").await;
        }
        if filter == "vendor" {
            // Each filter is labelled by what it filters.
            let label = c
                .execute(
                    "return document.getElementById('filter-vendor').parentElement.firstChild.textContent",
                    vec![],
                )
                .await
                .unwrap();
            assert_eq!(label, "Vendor");
            // The demo's AMD GPUs: 16 MI300X on Azure and 2 MI210 on a lab workstation.
            let s = api(&base, "/api/v1/summary?vendor=amd&group_by=vendor").await;
            assert_eq!(s["total"]["gpus"], 18, "{s}");
            assert_eq!(s["groups"].as_array().unwrap().len(), 1, "{s}");
            shot("overview-vendor-amd").await;
        }
    }

    // Drill down: the team filter carries to the inventory, then to a GPU.
    c.goto(&format!("{base}/?team=nlp")).await.unwrap();
    c.find(Locator::LinkText("Inventory"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let first = c
        .wait()
        .for_element(Locator::Css("#inventory tbody tr td a"))
        .await
        .unwrap();
    let uuid = first.text().await.unwrap();
    assert!(c.current_url().await.unwrap().as_str().contains("team=nlp"));
    first.click().await.unwrap();
    let shown = text(&c, "#gpu-uuid").await;
    assert_eq!(shown, uuid);
    // The page's range (the default, 30 days, carried by every link) is the API's default.
    let detail = api(&base, &format!("/api/v1/gpus/{uuid}")).await;
    assert_eq!(detail["team"], "nlp");
    let hours = detail["hours"].as_array().unwrap().len() as i64;
    assert_eq!(text(&c, "#gpu-hours").await, count(hours));
    let rate = detail["usd_per_hour"].as_f64().unwrap();
    assert_eq!(text(&c, "#cost").await, usd(rate * hours as f64));
    shot("gpu").await;

    // Every page, for the screenshots.
    for (name, path) in [
        ("overview", "/".to_string()),
        ("inventory", "/inventory".to_string()),
        ("teams", "/teams".to_string()),
        ("team-nlp", "/teams/nlp".to_string()),
        ("usage", "/usage".to_string()),
        ("waste", "/waste".to_string()),
        ("sources", "/sources".to_string()),
    ] {
        c.goto(&format!("{base}{path}")).await.unwrap();
        c.wait().for_element(Locator::Css("main h1")).await.unwrap();
        let src = c.source().await.unwrap();
        assert!(src.contains("Demo data"), "{name} must say it is demo data");
        shot(name).await;
    }
    // The overview's forecast, scrolled into view: its figures are the API's, and with ten
    // days of history it has a projection to show.
    c.goto(&format!("{base}/")).await.unwrap();
    let fc = api(&base, "/api/v1/forecast").await;
    let total = &fc["total"];
    assert_eq!(
        text(&c, "#forecast-mtd").await,
        usd(total["month_to_date_usd"].as_f64().unwrap())
    );
    let expected = total["month_end_usd"]["expected"]
        .as_f64()
        .unwrap_or_else(|| panic!("ten days of history make a forecast: {fc}"));
    assert_eq!(text(&c, "#forecast-month-end").await, usd(expected));
    c.execute(
        "document.getElementById('forecast-mtd').closest('.cards').previousElementSibling\
         .scrollIntoView({block: 'start'});",
        vec![],
    )
    .await
    .unwrap();
    shot("overview-forecast").await;
    // The content security policy allows no inline script or style: the stylesheet and the
    // sorting script are files, and both take effect (charts, filters and sorting work).
    c.goto(&format!("{base}/inventory")).await.unwrap();
    c.wait()
        .for_element(Locator::Css("table.sortable th"))
        .await
        .unwrap();
    let styled = c
        .execute(
            "return [getComputedStyle(document.querySelector('header')).display, \
                     getComputedStyle(document.querySelector('table.sortable th')).cursor, \
                     document.querySelectorAll('svg.chart').length]",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(styled[0], "flex", "the stylesheet applies: {styled}");
    assert_eq!(styled[1], "pointer", "{styled}");
    c.find(Locator::Css("table.sortable th"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let sorted = c
        .execute(
            "return document.querySelector('table.sortable th').dataset.dir || ''",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(sorted, "asc", "the sorting script runs");
    c.goto(&format!("{base}/")).await.unwrap();
    let charts = c
        .execute(
            "return document.querySelectorAll('svg.chart').length",
            vec![],
        )
        .await
        .unwrap();
    assert!(charts.as_u64().unwrap_or(0) > 0, "charts render: {charts}");
    c.close().await.unwrap();
    println!(
        "screenshots: {}",
        shots.canonicalize().unwrap_or(shots).display()
    );
}
