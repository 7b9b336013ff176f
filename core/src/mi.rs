//! The core's global allocator: mimalloc, asked through `mi_malloc` for what needs at most a
//! pointer's alignment and through `MiMalloc` (`mi_malloc_aligned`) for the rest.
//!
//! Every mimalloc block is 8-aligned (block sizes are multiples of 8, a page's first block is
//! 16-aligned), so `mi_malloc` serves any layout aligned to at most 8. `MiMalloc` asks
//! `mi_malloc_aligned` for every layout, whose fast path needs a free block in the size
//! class's page; when there is none it over-allocates unless the class is a power of two: a
//! 224-byte vector of four `Item`s then comes from the 256-byte class, with a read of the
//! block's page in the page map (a cold line with many keys). Docs: docs/native-core.md,
//! "Many keys: the allocator's aligned path (session 22, keys22)".

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use mimalloc::MiMalloc;

extern "C" {
    fn mi_malloc(size: usize) -> *mut c_void;
    fn mi_zalloc(size: usize) -> *mut c_void;
    fn mi_realloc(p: *mut c_void, size: usize) -> *mut c_void;
}

/// The alignment of every mimalloc block.
const PLAIN_ALIGN: usize = 8;

pub struct Mi;

// SAFETY: each layout aligned to at most `PLAIN_ALIGN` is allocated, zeroed and reallocated by
// mimalloc's unaligned calls, whose blocks are that aligned; any other by `MiMalloc`; a layout's
// alignment does not change between its allocation and its realloc or dealloc, and `mi_free`
// (`MiMalloc::dealloc`) frees blocks of either kind.
unsafe impl GlobalAlloc for Mi {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.align() <= PLAIN_ALIGN {
            mi_malloc(l.size()).cast()
        } else {
            MiMalloc.alloc(l)
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.align() <= PLAIN_ALIGN {
            mi_zalloc(l.size()).cast()
        } else {
            MiMalloc.alloc_zeroed(l)
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        MiMalloc.dealloc(p, l)
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, size: usize) -> *mut u8 {
        if l.align() <= PLAIN_ALIGN {
            mi_realloc(p.cast(), size).cast()
        } else {
            MiMalloc.realloc(p, l, size)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};

    extern "C" {
        fn mi_usable_size(p: *const std::ffi::c_void) -> usize;
    }

    /// Every layout gets a block of its alignment, zeroed when asked, its bytes kept by a
    /// realloc (the test binary allocates through `Mi` too: lib.rs's `#[global_allocator]`).
    #[test]
    fn blocks_have_their_layouts_alignment() {
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1, 7, 8, 24, 40, 56, 184, 224, 1000, 70_000] {
                let l = Layout::from_size_align(size, align).unwrap();
                // Many blocks of a layout: a class's blocks are at every multiple of its size.
                let blocks: Vec<*mut u8> = (0..64)
                    .map(|i| {
                        // SAFETY: a layout of non-zero size; the block is freed below.
                        let p = unsafe { if i % 2 == 0 { alloc(l) } else { alloc_zeroed(l) } };
                        assert!(!p.is_null());
                        assert_eq!(p as usize % align, 0, "size {size} align {align}");
                        if i % 2 == 1 {
                            // SAFETY: `size` bytes of the block just allocated.
                            assert!(unsafe { std::slice::from_raw_parts(p, size) }.iter().all(|&b| b == 0));
                        }
                        // SAFETY: as above.
                        unsafe { p.write_bytes(0xa5, size) };
                        p
                    })
                    .collect();
                for p in blocks {
                    // SAFETY: a block of `l`, grown then freed with its new layout.
                    unsafe {
                        let q = realloc(p, l, size * 3);
                        assert_eq!(q as usize % align, 0, "realloc: size {size} align {align}");
                        assert!(std::slice::from_raw_parts(q, size).iter().all(|&b| b == 0xa5));
                        dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
                    }
                }
            }
        }
    }

    /// A 224-byte layout of alignment 8 (a vector of four 56-byte `Item`s) comes from the
    /// 224-byte class even when its page has no free block left: `mi_malloc_aligned` would
    /// over-allocate then (224 + 7 bytes: the 256-byte class).
    #[test]
    fn plain_layouts_come_from_their_own_size_class() {
        let l = Layout::from_size_align(224, 8).unwrap();
        // More blocks than a page holds, so the page runs out of free blocks.
        let blocks: Vec<*mut u8> = (0..20_000)
            .map(|_| {
                // SAFETY: a layout of non-zero size; freed below.
                unsafe { alloc(l) }
            })
            .collect();
        for &p in &blocks {
            // SAFETY: a live block of mimalloc's.
            assert_eq!(unsafe { mi_usable_size(p.cast()) }, 224);
        }
        for p in blocks {
            // SAFETY: a block of `l`.
            unsafe { dealloc(p, l) };
        }
    }
}
