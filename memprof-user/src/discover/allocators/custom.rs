//! The functions named on the command line (`--alloc-fn`, `--free-fn`,
//! `--while`): their specs, and the names reports give the
//! `--alloc-fn` rows.
use std::{collections::BTreeMap, path::Path, sync::OnceLock};

use memprof_common::{
    allocators::{ALLOCATORS, NO_ARG, RELEASERS},
    mappings::MAPPING_FUNCTIONS,
};

use super::file_name;

/// A function named on the command line as an allocator (`--alloc-fn`)
/// or a release function (`--free-fn`). Argument positions are 0-based
/// here (1-based on the command line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustomFunction {
    pub symbol: String,
    /// Looked for in this module only: a path, or a file name (with or
    /// without its version suffix: `libfoo.so` matches `libfoo.so.1`).
    pub module: Option<String>,
    pub role: CustomRole,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CustomRole {
    Alloc {
        size_arg: u8,
        count_arg: u8,
        /// The block a realloc-like function is given, or NO_ARG.
        ptr_arg: u8,
    },
    Free {
        ptr_arg: u8,
    },
    /// `--while`: allocations are recorded only inside its calls.
    Region,
}

impl CustomFunction {
    /// `SYMBOL[@MODULE]:size=N[,count=N][,ptr=N]` (`free`: `:ptr=N`).
    pub fn parse(text: &str, free: bool) -> Result<CustomFunction, String> {
        let usage = if free {
            "expected SYMBOL[@MODULE]:ptr=N"
        } else {
            "expected SYMBOL[@MODULE]:size=N[,count=N][,ptr=N]"
        };
        let (name, args) = text.split_once(':').ok_or(usage)?;
        let (symbol, module) = match name.split_once('@') {
            Some((symbol, module)) => (symbol, Some(module.to_string())),
            None => (name, None),
        };
        if symbol.is_empty() || module.as_deref() == Some("") {
            return Err(usage.to_string());
        }
        let mut positions: BTreeMap<&str, u8> = BTreeMap::new();
        for pair in args.split(',') {
            let (key, value) = pair.split_once('=').ok_or(usage)?;
            if !matches!(key, "size" | "count" | "ptr") || (free && key != "ptr") {
                return Err(format!("unknown key {key:?}: {usage}"));
            }
            let position: u8 = value
                .parse()
                .ok()
                .filter(|n| (1..=6).contains(n))
                .ok_or_else(|| format!("{key}={value}: argument positions are 1 to 6"))?;
            positions.insert(key, position - 1);
        }
        let role = if free {
            CustomRole::Free {
                ptr_arg: *positions.get("ptr").ok_or(usage)?,
            }
        } else {
            CustomRole::Alloc {
                size_arg: *positions.get("size").ok_or(usage)?,
                count_arg: positions.get("count").copied().unwrap_or(NO_ARG),
                ptr_arg: positions.get("ptr").copied().unwrap_or(NO_ARG),
            }
        };
        Ok(CustomFunction {
            symbol: symbol.to_string(),
            module,
            role,
        })
    }

    /// `FUNCTION[@MODULE]` (`--while`).
    pub fn region(text: &str) -> Result<CustomFunction, String> {
        let (symbol, module) = match text.split_once('@') {
            Some((symbol, module)) => (symbol, Some(module.to_string())),
            None => (text, None),
        };
        if symbol.is_empty() || module.as_deref() == Some("") || symbol.contains(':') {
            return Err(
                "expected FUNCTION[@MODULE], FUNCTION as the binary names it (C++: its mangled name)"
                    .to_string(),
            );
        }
        let probed = ALLOCATORS.iter().any(|a| a.name == symbol)
            || RELEASERS.iter().any(|(name, _)| *name == symbol)
            || MAPPING_FUNCTIONS.iter().any(|(name, _)| *name == symbol);
        if probed {
            return Err(format!(
                "{symbol} is a function memprof probes as an allocator; --while takes one that calls them"
            ));
        }
        Ok(CustomFunction {
            symbol: symbol.to_string(),
            module,
            role: CustomRole::Region,
        })
    }

    pub fn wants(&self, module: &Path) -> bool {
        let Some(wanted) = &self.module else {
            return true;
        };
        let name = file_name(module);
        module == Path::new(wanted)
            || module.ends_with(wanted)
            || name == wanted
            || name
                .strip_prefix(wanted.as_str())
                .is_some_and(|rest| rest.starts_with('.'))
    }
}

/// Names of the `--alloc-fn` functions, whose rows follow `ALLOCATORS`
/// (set once, before any report is made).
static CUSTOM_NAMES: OnceLock<Vec<String>> = OnceLock::new();

/// The row of the `index`th `--alloc-fn`.
pub(super) fn custom_row(index: usize) -> usize {
    ALLOCATORS.len() + index
}

/// Remembers the `--alloc-fn` names for reports.
pub fn register_custom(custom: &[CustomFunction]) {
    let names = custom
        .iter()
        .filter(|f| matches!(f.role, CustomRole::Alloc { .. }))
        .map(|f| f.symbol.clone())
        .collect();
    let _ = CUSTOM_NAMES.set(names);
}

/// How reports name the allocator of row `index`.
pub fn allocator_name(index: u32) -> &'static str {
    if let Some(name) = memprof_common::mappings::mapping_name(index) {
        return name;
    }
    if let Some(name) = memprof_common::usdt::provider_name(index) {
        return name;
    }
    let index = index as usize;
    match ALLOCATORS.get(index) {
        Some(spec) => spec.shown,
        None => CUSTOM_NAMES
            .get()
            .and_then(|names| names.get(index - ALLOCATORS.len()))
            .map_or("?", String::as_str),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_custom_functions() {
        let alloc = CustomFunction::parse("rt_alloc@librt.so:size=2,count=3,ptr=1", false).unwrap();
        assert_eq!(alloc.symbol, "rt_alloc");
        assert_eq!(alloc.module.as_deref(), Some("librt.so"));
        assert_eq!(
            alloc.role,
            CustomRole::Alloc {
                size_arg: 1,
                count_arg: 2,
                ptr_arg: 0
            }
        );
        assert!(alloc.wants(Path::new("/opt/x/librt.so.1")));
        assert!(!alloc.wants(Path::new("/opt/x/librtx.so")));
        let free = CustomFunction::parse("rt_free:ptr=1", true).unwrap();
        assert_eq!(free.role, CustomRole::Free { ptr_arg: 0 });
        for bad in [
            "rt_alloc",
            "rt_alloc:count=1",
            "rt_alloc:size=0",
            "rt_alloc:size=7",
            "@x:size=1",
        ] {
            assert!(CustomFunction::parse(bad, false).is_err(), "{bad}");
        }
        assert!(CustomFunction::parse("rt_free:size=1", true).is_err());
    }
}
