//! `--format html`: one self-contained page (no network: style, script
//! and data inlined) to explore a report in a browser. The data is the
//! report's JSON, version 2 and unindented (each frame once: 65,538
//! stacks of 40 frames take ~15 MB), and the page builds its views from
//! it; names a profiled process controls are put on the page as text,
//! never as markup.
use anyhow::Result;

use super::{json, Report};

const PAGE: &str = include_str!("html/page.html");
const STYLE: &str = include_str!("html/page.css");
const SCRIPT: &str = include_str!("html/page.js");

pub fn render(report: &Report) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    json::write_unindented(report, &mut data)?;
    let (head, rest) = PAGE.split_once("/*STYLE*/").expect("the page's style slot");
    let (middle, rest) = rest.split_once("/*DATA*/").expect("the page's data slot");
    let (before_script, tail) = rest
        .split_once("/*SCRIPT*/")
        .expect("the page's script slot");
    let mut page = Vec::with_capacity(data.len() + PAGE.len() + STYLE.len() + SCRIPT.len());
    page.extend_from_slice(head.as_bytes());
    page.extend_from_slice(STYLE.as_bytes());
    page.extend_from_slice(middle.as_bytes());
    // Inside <script>, "</script>" or "<!--" in a name would end or
    // change the element: every "<" (only ever inside a JSON string) is
    // written as its escape.
    for &byte in &data {
        match byte {
            b'<' => page.extend_from_slice(b"\\u003c"),
            byte => page.push(byte),
        }
    }
    page.extend_from_slice(before_script.as_bytes());
    page.extend_from_slice(SCRIPT.as_bytes());
    page.extend_from_slice(tail.as_bytes());
    Ok(page)
}
