//! `memprof monitor`'s HTTP endpoints (--listen): `/metrics` (Prometheus
//! text), `/debug/pprof/allocs` and `/debug/pprof/heap` (as Go's
//! net/http/pprof serves them: go tool pprof, Grafana Alloy's
//! pyroscope.scrape and Parca read them unchanged) and `/healthz`; where
//! and to whom: [`super::listen`]. Each request asks the session for a
//! report, made on its loop (which owns the kernel's maps), and renders it
//! here.
use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use anyhow::Result;
use http_body_util::Full;
use hyper::{body::Bytes, header, Request, Response, StatusCode};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::web_config::WebConfig;
use crate::{
    report,
    report::{
        model::Report,
        options::{FilterOptions, GroupBy, ReportOptions},
    },
};

/// What a request needs of the session.
pub struct ReportRequest {
    /// How the report is cut (pprof: every stack; metrics: the top call
    /// sites by caller).
    pub cut: ReportOptions,
    pub reply: oneshot::Sender<Result<Report, String>>,
}

/// The longest `?seconds=N` a profile request may ask for: each waiting
/// request holds a whole report meanwhile.
const MAX_DELTA_SECS: u64 = 300;

/// What the endpoints serve.
#[derive(Clone, Copy)]
pub struct Settings {
    /// `--metrics-sites`.
    pub metrics_sites: usize,
    /// `--metrics-labels`.
    pub metrics_labels: crate::monitor::metrics::ProcessLabels,
    /// `--live`: the heap profile exists.
    pub live: bool,
}

pub type Reply = Response<Full<Bytes>>;

/// One request's reply; 401 without the credentials `web` asks for.
pub async fn answer(
    request: Request<hyper::body::Incoming>,
    requests: mpsc::Sender<ReportRequest>,
    settings: Settings,
    deltas: Arc<Semaphore>,
    web: Arc<WebConfig>,
) -> Result<Reply, Infallible> {
    let authorization = request.headers().get(header::AUTHORIZATION);
    if !web
        .admits(authorization.map(|value| value.as_bytes()))
        .await
    {
        let mut reply = text(StatusCode::UNAUTHORIZED, "Unauthorized\n".to_string());
        reply.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"memprof\""),
        );
        return Ok(reply);
    }
    let query = query_pairs(request.uri().query().unwrap_or(""));
    let reply = match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".to_string()),
        "/metrics" => metrics(&requests, &query, settings).await,
        "/debug/pprof/allocs" => profile(&requests, &query, Profile::Allocs, &deltas).await,
        "/debug/pprof/heap" if !settings.live => text(
            StatusCode::NOT_FOUND,
            "the heap profile needs memprof monitor --live\n".to_string(),
        ),
        "/debug/pprof/heap" => profile(&requests, &query, Profile::Heap, &deltas).await,
        _ => text(StatusCode::NOT_FOUND, "Unknown profile\n".to_string()),
    };
    Ok(reply)
}

/// A report from the session, cut as `cut` says.
async fn report_now(
    requests: &mpsc::Sender<ReportRequest>,
    cut: ReportOptions,
) -> Result<Report, String> {
    let (reply, answer) = oneshot::channel();
    requests
        .send(ReportRequest { cut, reply })
        .await
        .map_err(|_| "the profile has ended".to_string())?;
    answer
        .await
        .map_err(|_| "the profile has ended".to_string())?
}

async fn metrics(
    requests: &mpsc::Sender<ReportRequest>,
    query: &HashMap<String, String>,
    settings: Settings,
) -> Reply {
    // One row per call site (caller): the labels say no more.
    // Every site: the metrics rank them by bytes allocated, not held.
    let mut cut = cut_for(usize::MAX, 1);
    cut.group_by = GroupBy::Caller;
    match report_now(requests, cut).await {
        Ok(mut report) => {
            keep_processes(&mut report, query);
            let mut reply = text(
                StatusCode::OK,
                crate::monitor::metrics::render(
                    &report,
                    settings.metrics_sites,
                    settings.metrics_labels,
                ),
            );
            reply.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            reply
        }
        Err(err) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Profile {
    Allocs,
    Heap,
}

/// As Go serves its heap and allocs profiles: gzipped protobuf, the four
/// sample types in Go's order; allocs defaults to alloc_space, heap to
/// inuse_space. `?seconds=N`: what changed over the next N seconds.
async fn profile(
    requests: &mpsc::Sender<ReportRequest>,
    query: &HashMap<String, String>,
    which: Profile,
    deltas: &Semaphore,
) -> Reply {
    let seconds = match query.get("seconds").map(|s| s.parse::<u64>()) {
        None => None,
        Some(Ok(n)) if (1..=MAX_DELTA_SECS).contains(&n) => Some(n),
        Some(_) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!(
                    "invalid value for \"seconds\" - must be a positive integer, at most {MAX_DELTA_SECS}\n"
                ),
            )
        }
    };
    let _delta = match seconds.map(|_| deltas.try_acquire()) {
        Some(Err(_)) => {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "another ?seconds= profile is being taken\n".to_string(),
            )
        }
        Some(Ok(permit)) => Some(permit),
        None => None,
    };
    let cut = cut_for(usize::MAX, 64);
    let before = match seconds {
        Some(n) => {
            let before = report_now(requests, cut.clone()).await;
            tokio::time::sleep(Duration::from_secs(n)).await;
            Some(before)
        }
        None => None,
    };
    let now = report_now(requests, cut).await;
    let report = match (before, now) {
        (_, Err(err)) | (Some(Err(err)), _) => {
            return text(StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n"))
        }
        (Some(Ok(before)), Ok(now)) => report::pprof::delta(&before, now),
        (None, Ok(now)) => now,
    };
    let mut report = report;
    keep_processes(&mut report, query);
    let default = match which {
        Profile::Allocs => report::pprof::DefaultSample::AllocSpace,
        Profile::Heap => report::pprof::DefaultSample::InuseSpace,
    };
    match report::pprof::render_with(&report, default) {
        Ok(body) => {
            let name = match (which, seconds.is_some()) {
                (Profile::Allocs, false) => "allocs",
                (Profile::Allocs, true) => "allocs-delta",
                (Profile::Heap, false) => "heap",
                (Profile::Heap, true) => "heap-delta",
            };
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/octet-stream")
                .header(
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{name}\""),
                )
                .header("X-Content-Type-Options", "nosniff")
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_default()
        }
        Err(err) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")),
    }
}

/// `?pid=N`, `?comm=NAME`: only those processes.
fn keep_processes(report: &mut Report, query: &HashMap<String, String>) {
    if let Some(pid) = query.get("pid") {
        report.processes.retain(|p| p.pid.to_string() == *pid);
    }
    if let Some(comm) = query.get("comm") {
        report.processes.retain(|p| p.command == *comm);
    }
}

fn cut_for(top: usize, depth: usize) -> ReportOptions {
    ReportOptions {
        top: Some(top),
        depth: Some(depth),
        sort: None,
        min_bytes: crate::human::numbers::ByteCount(0),
        group_by: GroupBy::Stack,
        format: crate::report::options::Format::Json,
        output: None,
        json_version: crate::report::options::JsonVersion::V2,
        filters: FilterOptions {
            focus: None,
            ignore: None,
            skip_frames: 0,
        },
    }
}

fn text(status: StatusCode, body: String) -> Reply {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

/// `a=1&b=2` (no percent-decoding: the values memprof reads are numbers
/// and process names).
pub fn query_pairs(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}
