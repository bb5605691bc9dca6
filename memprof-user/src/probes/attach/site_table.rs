//! The kernel's site table: which site group each probed file's probes
//! took (a group's sites are found by its number and their page offsets),
//! and the USDT probes' specs.
use anyhow::{Context as _, Result};
use aya::maps::{Array, MapData};
use memprof_common::{
    dispatch::{site_index, SiteEntry},
    usdt::UsdtSpec,
};

use super::{plan::Planned, ProbedFunction, Probes};

/// The kernel's site table and the groups free in it; the USDT probes'
/// specs and the next index free there.
pub(super) struct SiteTable {
    pub(super) map: Array<MapData, SiteEntry>,
    /// Groups never used start here; up to `limit`.
    pub(super) next_group: u32,
    pub(super) limit: u32,
    /// Groups freed (`reclaim`), taken first.
    pub(super) free: Vec<u32>,
    /// Each group taken, in order (what one file's probes took).
    pub(super) placed: Vec<u32>,
    /// Reclaims that freed groups so far, and the files they freed.
    pub(super) reclaims: u64,
    pub(super) freed_files: u64,
    pub(super) usdt_specs: Array<MapData, UsdtSpec>,
    /// Specs never used start here; up to `spec_limit`. Freed ones (with
    /// their group) are taken first.
    pub(super) next_spec: u32,
    pub(super) spec_limit: u32,
    pub(super) free_specs: Vec<u32>,
}

/// The site table's groups in use, how many it holds, and the files whose
/// groups were freed so far.
pub struct SiteGroups {
    pub used: u64,
    pub limit: u64,
    pub freed_files: u64,
}

/// No room left in one of the kernel's tables: site groups, or USDT
/// probes' specs (of this many).
#[derive(Debug)]
pub(super) enum TableFull {
    SiteGroups(u32),
    UsdtSpecs(u32),
}

impl std::fmt::Display for TableFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableFull::SiteGroups(limit) => write!(
                f,
                "too many libraries with allocators: the kernel's site table holds \
                 {limit} groups of probes, each in use by a running process"
            ),
            TableFull::UsdtSpecs(limit) => write!(
                f,
                "too many USDT probes: the kernel's table holds {limit}, each in use \
                 by a running process"
            ),
        }
    }
}

impl std::error::Error for TableFull {}

/// An entry of a kernel table: one freed before, else the next never
/// used, below `limit`.
fn take_index(free: &mut Vec<u32>, next: &mut u32, limit: u32) -> Option<u32> {
    free.pop().or_else(|| {
        (*next < limit).then(|| {
            *next += 1;
            *next - 1
        })
    })
}

impl SiteTable {
    /// Puts a USDT probe's spec in the kernel's table; its index.
    fn add_usdt(&mut self, spec: UsdtSpec) -> Result<u32> {
        let index = take_index(&mut self.free_specs, &mut self.next_spec, self.spec_limit)
            .ok_or(TableFull::UsdtSpecs(self.spec_limit))?;
        if let Err(err) = self.usdt_specs.set(index, spec, 0) {
            self.free_specs.push(index);
            return Err(err).context("map USDT_SPECS");
        }
        Ok(index)
    }
}

impl Probes {
    /// Takes the next site group for `members`: their sites go to the
    /// kernel's table, and to `functions`.
    pub(super) fn place_group(&mut self, members: &[Planned]) -> Result<u32> {
        let sites = &mut self.sites;
        let group = take_index(&mut sites.free, &mut sites.next_group, sites.limit)
            .ok_or(TableFull::SiteGroups(sites.limit))?;
        self.sites.placed.push(group);
        let hold = self.attached.groups.entry(group).or_default();
        hold.offsets = members.iter().map(|p| p.file_offset).collect();
        for probe in members {
            let mut cookie = probe.entry.cookie;
            if let Some(usdt) = probe.usdt {
                let index = self.sites.add_usdt(usdt.spec)?;
                hold.usdt_specs.push(index);
                cookie = index.into();
            }
            let site = SiteEntry {
                cookie,
                entry: probe.entry.program,
                ret: probe.ret.unwrap_or(0),
            };
            self.sites
                .map
                .set(site_index(group.into(), probe.file_offset), site, 0)
                .context("map SITE_TABLE")?;
        }
        self.usdt_placed |= members.iter().any(|probe| probe.usdt.is_some());
        for probe in members {
            let file_name = crate::host::procfs::paths::mapped_file_name(probe.module);
            if let Some(site) = probe.site {
                self.functions.push(ProbedFunction {
                    module: probe.module.to_path_buf(),
                    file_name: file_name.clone(),
                    function: site.function.clone(),
                    role: probe.entry.role,
                    allocator: probe.entry.allocator,
                    file_offset: site.file_offset,
                    code: site.code.clone(),
                });
            }
            if let Some(usdt) = probe.usdt {
                self.functions.push(ProbedFunction {
                    module: probe.module.to_path_buf(),
                    file_name: file_name.clone(),
                    function: format!("{}:{}", usdt.provider(), usdt.name),
                    role: probe.entry.role,
                    allocator: probe.entry.allocator,
                    file_offset: usdt.file_offset,
                    code: Vec::new(),
                });
            }
        }
        Ok(group)
    }

    /// How full the kernel's site table is.
    pub fn site_groups(&self) -> SiteGroups {
        SiteGroups {
            used: u64::from(self.sites.next_group) - self.sites.free.len() as u64,
            limit: self.sites.limit.into(),
            freed_files: self.sites.freed_files,
        }
    }
}
