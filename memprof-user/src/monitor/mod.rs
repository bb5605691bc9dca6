//! `memprof monitor`: a profile that runs for days. Its HTTP endpoints
//! (where they listen, TLS and users) and metrics, the cost budget and its calibration, eviction of what
//! ended processes left, the `--out` directory and the terminal view.
pub mod budget;
pub mod calibrate;
pub mod evict;
pub mod http;
pub mod listen;
pub mod metrics;
pub mod out_dir;
pub mod view;
pub mod web_config;
