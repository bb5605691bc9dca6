//! Task-local storage (`BPF_MAP_TYPE_TASK_STORAGE`), which aya-ebpf 0.2
//! has no type for: a value hung off each thread's `task_struct`, found
//! without hashing and freed with the thread.
use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE, BPF_F_NO_PREALLOC},
    helpers::generated::{bpf_get_current_task_btf, bpf_task_storage_delete, bpf_task_storage_get},
};

/// A BTF map definition (section `.maps`): the kernel requires BTF for
/// the key and value types of local storage maps. The fields only encode
/// the map's type, key, value and flags in BTF; they are never read.
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are placeholders for the loader, never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

/// `bpf_task_storage_get`: create the value (zeroed) if the task has none.
const CREATE: u64 = 1;

impl<T> TaskStorage<T> {
    pub const fn new() -> Self {
        Self {
            r#type: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
            map_flags: ptr::null(),
        }
    }

    #[inline(always)]
    fn as_ptr(&self) -> *mut c_void {
        ptr::from_ref(self).cast_mut().cast()
    }

    /// The running thread's value; with `create`, a zeroed one is made
    /// if it has none (None only when the kernel cannot allocate it).
    #[inline(always)]
    pub fn current(&self, create: bool) -> Option<*mut T> {
        let flags = if create { CREATE } else { 0 };
        // SAFETY: the helper takes the running task's BTF pointer.
        let value = unsafe {
            bpf_task_storage_get(
                self.as_ptr(),
                bpf_get_current_task_btf(),
                ptr::null_mut(),
                flags,
            )
        };
        (!value.is_null()).then_some(value.cast())
    }

    /// Drops the running thread's value.
    #[inline(always)]
    pub fn remove_current(&self) {
        // SAFETY: as in `current`.
        unsafe { bpf_task_storage_delete(self.as_ptr(), bpf_get_current_task_btf()) };
    }
}
