//! Planning probes: what runs at each site found (its program and cookie,
//! and whether it has a return probe), and which sites share a group.
use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use anyhow::{bail, Result};
use memprof_common::{
    allocators::{is_python_allocator, ALLOCATORS, GO_MALLOCGC_ROW, MALLOC},
    cookies::ProbeCookie,
    dispatch::{entry, page_offset, ret, LibraryCode},
    mappings::{mapping_name, MappingCookie},
};

use super::Unprobed;
use crate::{
    discover::{
        allocators::{
            allocator_name, CustomFunction, LoaderSite, ModuleSites, ProbeSite, Runtime, SiteRole,
        },
        go::go_module_of,
        usdt::UsdtSite,
    },
    host::files,
    human::{error::UserError, numbers::how_many},
};

/// One probe to place: where, and what runs there.
pub(super) struct Planned<'a> {
    pub(super) module: &'a Path,
    pub(super) file_offset: u64,
    pub(super) entry: EntryProbe,
    /// The program at its return (`dispatch::ret`), if it has a return
    /// probe.
    pub(super) ret: Option<u32>,
    /// The site, listed in `functions` (the loader's probe is not).
    pub(super) site: Option<&'a ProbeSite>,
    /// A USDT probe: its spec goes to the kernel's table, its index in
    /// the cookie.
    pub(super) usdt: Option<&'a UsdtSite>,
    /// A USDT probe's semaphore (file offset).
    pub(super) semaphore: Option<u64>,
}

impl<'a> Planned<'a> {
    /// `session`: the malloc-like functions (those that never call another
    /// hooked one) get session probes.
    fn site(
        module: &'a Path,
        site: &'a ProbeSite,
        sites: &ModuleSites,
        live: bool,
        session: bool,
    ) -> Self {
        Planned {
            module,
            file_offset: site.file_offset,
            entry: entry_probe(site, sites),
            ret: site.returns(live).then_some(match site.role {
                SiteRole::Mapping(_) => ret::MAPPING,
                SiteRole::Region => ret::REGION,
                SiteRole::Alloc(cookie) if session && !cookie.may_nest => ret::SESSION_ALLOC,
                _ => ret::ALLOC,
            }),
            site: Some(site),
            usdt: None,
            semaphore: None,
        }
    }

    /// A USDT probe of the allocation-sampling contract.
    pub(super) fn usdt(module: &'a Path, site: &'a UsdtSite) -> Self {
        let (program, role) = match site.is_alloc() {
            true => (entry::USDT_ALLOC, "alloc"),
            false => (entry::USDT_FREE, "free"),
        };
        Planned {
            module,
            file_offset: site.file_offset,
            entry: EntryProbe {
                program,
                // Set when the spec gets its index.
                cookie: 0,
                role,
                allocator: Some(site.provider()),
            },
            ret: None,
            site: None,
            usdt: Some(site),
            semaphore: site.semaphore,
        }
    }

    /// Whether this is a loader's probe (see [`Planned::loader`]).
    pub(super) fn is_loader(&self) -> bool {
        self.entry.program == entry::LOADER
    }

    /// The probe where a loader announces the objects it loaded.
    pub(super) fn loader(module: &'a Path, site: &LoaderSite) -> Self {
        Planned {
            module,
            file_offset: site.file_offset,
            entry: EntryProbe {
                program: entry::LOADER,
                cookie: site.r_debug_delta as u64,
                role: "loader",
                allocator: None,
            },
            ret: None,
            site: None,
            usdt: None,
            semaphore: None,
        }
    }

    /// The probes of a module's sites (frees and releases in live mode
    /// only).
    pub(super) fn module(
        module: &'a Path,
        sites: &'a ModuleSites,
        live: bool,
        session: bool,
    ) -> Vec<Self> {
        sites
            .sites
            .iter()
            .filter(|site| live || !matches!(site.role, SiteRole::Free | SiteRole::Release { .. }))
            .map(|site| Planned::site(module, site, sites, live, session))
            .collect()
    }

    pub(super) fn has_session(&self) -> bool {
        self.ret == Some(ret::SESSION_ALLOC)
    }
}

/// What runs at a site's entry probe.
pub(super) struct EntryProbe {
    /// `dispatch::entry`.
    pub(super) program: u32,
    pub(super) cookie: u64,
    pub(super) role: &'static str,
    pub(super) allocator: Option<&'static str>,
}

pub(super) fn entry_probe(site: &ProbeSite, sites: &ModuleSites) -> EntryProbe {
    match site.role {
        SiteRole::Alloc(cookie) => EntryProbe {
            // The dispatcher runs malloc with glibc's cookie compiled in;
            // a malloc with another cookie reads its own.
            program: if cookie == ProbeCookie::of_allocator(MALLOC) {
                entry::MALLOC
            } else if cookie.go_abi && usize::from(cookie.allocator) == GO_MALLOCGC_ROW {
                entry::GO_ALLOC
            } else {
                entry::ALLOC
            },
            cookie: cookie.encode(),
            role: "alloc",
            allocator: Some(allocator_name(cookie.allocator.into())),
        },
        SiteRole::Free => EntryProbe {
            program: entry::FREE,
            // Where the library's own code is, from the probe: frees it
            // makes of blocks it took without malloc are its own.
            cookie: sites
                .library_code_around(site.file_offset)
                .map_or(0, LibraryCode::encode),
            role: "free",
            allocator: None,
        },
        SiteRole::Release { ptr_arg } => EntryProbe {
            program: entry::RELEASE,
            cookie: u64::from(ptr_arg),
            role: "release",
            allocator: None,
        },
        SiteRole::Mapping(call) => EntryProbe {
            program: entry::MAPPING,
            // Where the C library's code is, from the probe: what it maps
            // itself is malloc's.
            cookie: {
                let library = sites.library_code_around(site.file_offset);
                MappingCookie::new(call, library.unwrap_or_default()).encode()
            },
            role: "mapping",
            allocator: mapping_name(call.allocator()),
        },
        SiteRole::Region => EntryProbe {
            program: entry::REGION,
            cookie: 0,
            role: "region",
            allocator: None,
        },
    }
}
/// Which of the sites found in a module are probed.
#[derive(Clone, Copy, Debug)]
pub(super) struct SiteChoice {
    /// Direct mappings are counted: the mapping functions.
    pub mappings: bool,
    /// CPython's allocators (off with `--no-python-allocators`).
    pub python: bool,
    /// `--live`.
    pub live: bool,
}

/// A module's sites, less those not chosen. In `--live`, CPython's are
/// left out of a build that inlines them into its callers
/// (`ModuleSites::python_inlined`): the frees made in that inlined code
/// would go unseen, and the objects they free would show as live.
pub(super) fn chosen(mut sites: ModuleSites, choice: SiteChoice) -> ModuleSites {
    let python = choice.python && !(choice.live && sites.python_inlined);
    sites.sites.retain(|site| match site.role {
        SiteRole::Mapping(_) => choice.mappings,
        // Named with --alloc-fn: probed as asked.
        SiteRole::Alloc(cookie) if usize::from(cookie.allocator) >= ALLOCATORS.len() => true,
        // Go's heap is freed by its garbage collector, unseen: not in
        // --live (see `GoModule::uncounted_heap`).
        SiteRole::Alloc(_) if site.go_code => !choice.live,
        _ => python || !is_python_allocator(&site.function),
    });
    sites
}

/// Turns away, before anything is probed, what would need a return
/// probe in Go code, which Go's moving stacks cannot survive (the
/// program would die), and `--alloc-fn` arguments memprof cannot read
/// there: one line saying why and what works instead.
pub(super) fn refuse_returns_in_go(module: &Path, sites: &ModuleSites, live: bool) -> Result<()> {
    let Some(go) = &sites.go else {
        return Ok(());
    };
    for site in sites.sites.iter().filter(|site| site.go_code) {
        let function = &site.function;
        let module = module.display();
        let why = match site.role {
            SiteRole::Region => format!(
                "--while {function}: it is Go code (in {module}), and --while needs a \
                 return probe there, which Go's moving stacks cannot survive; name a C \
                 function it calls, or record the whole run"
            ),
            SiteRole::Alloc(_) | SiteRole::Release { .. } if live => format!(
                "--live with {function}: it is Go code (in {module}), and pairing its \
                 blocks needs a return probe there, which Go's moving stacks cannot \
                 survive (and Go's garbage collector frees without a call); without \
                 --live its calls are counted at their entry"
            ),
            SiteRole::Alloc(_) if !go.passes_in_registers() => format!(
                "--alloc-fn {function}: it is Go code (in {module}) built by {}, which \
                 passes arguments on the stack; memprof reads Go's register arguments \
                 (go1.17 and later)",
                go.version_text()
            ),
            _ => continue,
        };
        bail!(UserError::new(why).with_exit_code(2));
    }
    Ok(())
}

/// What a module's figures miss where it is probed in part, for the
/// report: CPython built with its object allocator inlined, a Go program
/// whose heap is not counted.
pub(super) fn partly_probed(
    module: &Path,
    sites: &ModuleSites,
    choice: SiteChoice,
) -> Option<Unprobed> {
    if let Some(reason) = sites
        .go
        .as_ref()
        .and_then(|go| go.uncounted_heap(choice.live))
    {
        return Some(Unprobed {
            program: module.display().to_string(),
            reason,
            no_allocator: false,
        });
    }
    if !(choice.python && sites.python_inlined) {
        return None;
    }
    let reason = match choice.live {
        true => {
            "this CPython build inlines its object allocator (pymalloc) into its \
                 callers (LTO): with --live its objects are not tracked (their frees \
                 there go unseen), only the arenas it maps"
        }
        false => {
            "this CPython build inlines its object allocator (pymalloc) into its \
                  callers (LTO): objects allocated in that code are not counted (the \
                  arenas that code maps are, as mmap); calls through PyObject_Malloc, \
                  PyMem_Malloc and their family are"
        }
    };
    Some(Unprobed {
        program: module.display().to_string(),
        reason: reason.to_string(),
        no_allocator: false,
    })
}

/// Every `--alloc-fn`/`--free-fn`/`--while` function must be somewhere: a
/// one-line error naming the modules searched, unless it names a module
/// that is not loaded yet (probed if it is, later), or processes started
/// later are watched (`later`: it is looked for in their files).
pub(super) fn check_named_functions(
    custom: &[CustomFunction],
    modules: &[PathBuf],
    found: &[(PathBuf, ModuleSites)],
    later: bool,
) -> Result<()> {
    for function in custom {
        let found_here = found
            .iter()
            .any(|(_, sites)| sites.sites.iter().any(|s| s.function == function.symbol));
        if found_here {
            continue;
        }
        if let Some(module) = &function.module {
            if !modules.iter().any(|m| function.wants(m)) {
                eprintln!(
                    "memprof: {}@{module}: no such module yet; probed if the target loads it",
                    function.symbol
                );
                continue;
            }
        }
        if later {
            eprintln!(
                "memprof: {}: in no file mapped now; probed in the files of the processes watched",
                function.symbol
            );
            continue;
        }
        let searched: Vec<String> = modules.iter().map(|m| m.display().to_string()).collect();
        bail!(UserError::new(format!(
            "function {} not found{}; searched {}",
            function.symbol,
            function
                .module
                .as_ref()
                .map(|m| format!(" in a module named {m}"))
                .unwrap_or_default(),
            searched.join(", ")
        ))
        .with_exit_code(2));
    }
    Ok(())
}

/// The targets none of whose files has an allocator memprof knows.
pub(super) fn unprobed_targets(
    runtimes: &[Runtime],
    found: &[(PathBuf, ModuleSites)],
    live: bool,
) -> Vec<Unprobed> {
    let probed: HashSet<(u64, u64)> = found
        .iter()
        .map(|(m, _)| files::inode(m).unwrap_or_default())
        .collect();
    runtimes
        .iter()
        .filter(|runtime| {
            !runtime
                .modules
                .iter()
                .any(|m| probed.contains(&files::inode(m).unwrap_or_default()))
        })
        .map(|runtime| {
            let program = runtime.modules.first();
            let go = program.and_then(|p| go_module_of(p));
            let reason = match go.and_then(|go| go.uncounted_heap(live)) {
                Some(reason) => reason,
                None => format!(
                    "no allocator memprof knows in its {} (malloc, operator new, \
                     jemalloc, tcmalloc, mimalloc); name one with --alloc-fn",
                    how_many(runtime.modules.len() as u64, "module", "modules")
                ),
            };
            Unprobed {
                program: program.map(|m| m.display().to_string()).unwrap_or_default(),
                reason,
                no_allocator: true,
            }
        })
        .collect()
}

/// Session probes in site groups of one file each: a group's session link
/// is made on one file (its first member's: a group that took another
/// file's malloc as well left that one unlinked, and its calls uncounted).
pub(super) fn session_groups(planned: Vec<Planned>) -> Vec<Vec<Planned>> {
    let mut by_module: Vec<(&Path, Vec<Planned>)> = Vec::new();
    for probe in planned {
        match by_module
            .iter_mut()
            .find(|(module, _)| *module == probe.module)
        {
            Some((_, members)) => members.push(probe),
            None => by_module.push((probe.module, vec![probe])),
        }
    }
    by_module
        .into_iter()
        .flat_map(|(_, members)| site_groups(members))
        .collect()
}

/// `planned` probes in site groups: a group takes sites whose page
/// offsets differ (the kernel finds a site by its group and page offset).
pub(super) fn site_groups(planned: Vec<Planned>) -> Vec<Vec<Planned>> {
    let mut groups: Vec<(HashSet<u64>, Vec<Planned>)> = Vec::new();
    for probe in planned {
        let offset = page_offset(probe.file_offset);
        match groups
            .iter_mut()
            .find(|(taken, _)| !taken.contains(&offset))
        {
            Some((taken, members)) => {
                taken.insert(offset);
                members.push(probe);
            }
            None => groups.push((HashSet::from([offset]), vec![probe])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}
