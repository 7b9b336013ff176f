//! Reading a pyarrow `RecordBatch` through the Arrow C data interface (`__arrow_c_array__`:
//! a struct array with one child per column), without the `arrow` crate: the two C structs
//! are fixed by the Arrow specification. Columns of the types below become `Value`s; any other
//! type raises `Unsupported` (the caller then converts the batch in Python).
//!
//! The capsules own the exported structs and release them when they are dropped; a `Batch`
//! holds them, and a cell is copied out (`Batch::get`) only when it is read.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::keytable::{hash32, Named, Table};
use crate::program::bad;
use crate::value::Value;

#[repr(C)]
#[allow(dead_code)]
struct FfiSchema {
    format: *const c_char,
    name: *const c_char,
    metadata: *const c_char,
    flags: i64,
    n_children: i64,
    children: *mut *mut FfiSchema,
    dictionary: *mut FfiSchema,
    release: Option<unsafe extern "C" fn(*mut FfiSchema)>,
    private_data: *mut c_void,
}

#[repr(C)]
#[allow(dead_code)]
struct FfiArray {
    length: i64,
    null_count: i64,
    offset: i64,
    n_buffers: i64,
    n_children: i64,
    buffers: *mut *const c_void,
    children: *mut *mut FfiArray,
    dictionary: *mut FfiArray,
    release: Option<unsafe extern "C" fn(*mut FfiArray)>,
    private_data: *mut c_void,
}

/// A batch as named columns, read in place: a cell becomes a `Value` when it is asked for
/// (`get`), so no column is copied out as a whole. The batch keeps the capsules (and so the
/// exported buffers) alive.
pub struct Batch<'py> {
    pub names: Vec<String>,
    cols: Vec<Col>,
    pub len: usize,
    _keep: Bound<'py, PyAny>,
}

/// The distinct values of a string column (`dict`) and a table of their indexes, found by the
/// value's bytes (keys.rs's table, `keytable::Table`: 8 bytes per value, the index and its
/// 32-bit hash), the text held once, in `dict`.
#[derive(Default)]
struct Intern {
    table: Table,
    hasher: foldhash::fast::RandomState,
    dict: Vec<Arc<str>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    F32,
    F64,
    Utf8,
    LargeUtf8,
}

struct Col {
    kind: Kind,
    validity: *const u8,
    data: *const u8,
    offsets: *const u8,
    base: usize,
    /// A string column's distinct values so far: equal strings share one `Arc<str>` (one
    /// allocation per distinct value, and keys compare by pointer first). Given up when the
    /// column turns out to be mostly distinct values.
    intern: std::cell::RefCell<Option<Intern>>,
    seen: std::cell::Cell<usize>,
    /// The index in `Intern::dict` of the value interned last (a column of one repeated value
    /// needs no hashing); `u32::MAX`: none. An index, not an `Arc`: no reference count is
    /// touched to remember it.
    last: std::cell::Cell<u32>,
}

/// A string cell's bytes as text; the error every reader of a string column gives.
pub fn utf8(b: &[u8]) -> PyResult<&str> {
    std::str::from_utf8(b).map_err(|_| not_utf8())
}

#[cold]
fn not_utf8() -> PyErr {
    bad("arrow: a string that is not UTF-8")
}

impl Batch<'_> {
    /// Cell `j` of column `c`.
    #[inline]
    pub fn get(&self, c: usize, j: usize) -> PyResult<Value> {
        self.cell(c, j).ok_or_else(not_utf8)
    }

    /// `get`, with None for a string that is not UTF-8. Inlined into its callers, so that a
    /// row's values are built where they are stored: returned through memory, each one was
    /// stored and loaded back at a different width, which stalled the load until the row's
    /// (cold) stores before it had drained (perf: ~9% of the fraud samples on that load).
    #[inline(always)]
    fn cell(&self, c: usize, j: usize) -> Option<Value> {
        // Checked: a safe function must not read past the buffers, whatever its caller passes.
        assert!(j < self.len, "arrow: row {j} of a batch of {}", self.len);
        let col = &self.cols[c];
        let i = col.base + j;
        // SAFETY: `j < len`, every column was checked at least `len` long with the buffers its
        // type needs, and the capsules (so the buffers) live as long as `self`.
        unsafe {
            if !col.validity.is_null() && !bit(col.validity, i) {
                return Some(Value::Null);
            }
            macro_rules! prim {
                ($t:ty) => {
                    std::ptr::read_unaligned((col.data as *const $t).add(i))
                };
            }
            Some(match col.kind {
                Kind::Null => Value::Null,
                Kind::Bool => Value::Bool(bit(col.data, i)),
                Kind::I8 => Value::Int(prim!(i8) as i64),
                Kind::U8 => Value::Int(prim!(u8) as i64),
                Kind::I16 => Value::Int(prim!(i16) as i64),
                Kind::U16 => Value::Int(prim!(u16) as i64),
                Kind::I32 => Value::Int(prim!(i32) as i64),
                Kind::U32 => Value::Int(prim!(u32) as i64),
                Kind::I64 => Value::Int(prim!(i64)),
                Kind::F32 => Value::Float(prim!(f32) as f64),
                Kind::F64 => Value::Float(prim!(f64)),
                Kind::Utf8 | Kind::LargeUtf8 => Value::Str(col.interned(col.bytes(i))?),
            })
        }
    }

    /// The index among column `c`'s distinct strings of the value the column's last `get`
    /// returned, when that was a string and the column still interns (`Col::last`): equal
    /// indexes are equal strings. None otherwise (the caller then compares the text).
    pub fn last_interned(&self, c: usize) -> Option<u32> {
        let col = &self.cols[c];
        let i = col.last.get();
        (i != u32::MAX && col.intern.borrow().is_some()).then_some(i)
    }

    /// Cell `j` of string column `c` as text borrowed from the batch (no `Value`, no
    /// interning); None when the cell is null or the column holds no strings.
    pub fn str_at(&self, c: usize, j: usize) -> PyResult<Option<&str>> {
        match self.bytes_at(c, j) {
            None => Ok(None),
            Some(b) => utf8(b).map(Some),
        }
    }

    /// `str_at` without the UTF-8 check: the cell's bytes (for a caller that compares them
    /// with text it has checked already).
    pub fn bytes_at(&self, c: usize, j: usize) -> Option<&[u8]> {
        assert!(j < self.len, "arrow: row {j} of a batch of {}", self.len);
        let col = &self.cols[c];
        let i = col.base + j;
        if !matches!(col.kind, Kind::Utf8 | Kind::LargeUtf8) {
            return None;
        }
        // SAFETY: as in `get`.
        unsafe {
            if !col.validity.is_null() && !bit(col.validity, i) {
                return None;
            }
            Some(col.bytes(i))
        }
    }
}

impl Col {
    /// The bytes of cell `i` (an absolute index) of a string column.
    ///
    /// # Safety
    /// `i` is within the column and the column is `Utf8` or `LargeUtf8` (`Batch::get`).
    unsafe fn bytes(&self, i: usize) -> &[u8] {
        let (start, end) = if self.kind == Kind::Utf8 {
            let o = self.offsets as *const i32;
            (std::ptr::read_unaligned(o.add(i)) as usize, std::ptr::read_unaligned(o.add(i + 1)) as usize)
        } else {
            let o = self.offsets as *const i64;
            (std::ptr::read_unaligned(o.add(i)) as usize, std::ptr::read_unaligned(o.add(i + 1)) as usize)
        };
        if end > start {
            std::slice::from_raw_parts(self.data.add(start), end - start)
        } else {
            &[]
        }
    }

    /// The string of a cell's bytes, shared with the column's earlier equal cells while the
    /// column interns; None when the bytes are not UTF-8. A cell equal to an interned string
    /// is found by its bytes (checked as UTF-8 once, when its string was interned).
    #[inline(never)]
    fn interned(&self, b: &[u8]) -> Option<Arc<str>> {
        let mut guard = self.intern.borrow_mut();
        let Some(it) = guard.as_mut() else { return std::str::from_utf8(b).ok().map(Arc::from) };
        let seen = self.seen.get() + 1;
        self.seen.set(seen);
        if let Some(l) = it.dict.get(self.last.get() as usize).filter(|l| l.as_bytes() == b) {
            return Some(l.clone());
        }
        let Intern { table, hasher, dict } = it;
        let h = hash32(hasher, b);
        if let Some(i) = table.get(h, |i| dict[i as usize].as_bytes() == b) {
            self.last.set(i);
            return Some(dict[i as usize].clone());
        }
        let a: Arc<str> = Arc::from(std::str::from_utf8(b).ok()?);
        let i = dict.len() as u32;
        dict.push(a.clone());
        table.insert(Named { id: i, h });
        self.last.set(i);
        if seen >= 8192 && dict.len() * 4 > seen * 3 {
            *guard = None;
            self.last.set(u32::MAX);
        }
        Some(a)
    }
}

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the Arrow C data interface guarantees NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Buffer `i` of `a` as a pointer (null when absent).
unsafe fn buffer(a: &FfiArray, i: usize) -> *const u8 {
    if (i as i64) >= a.n_buffers || a.buffers.is_null() {
        return std::ptr::null();
    }
    *a.buffers.add(i) as *const u8
}

unsafe fn bit(p: *const u8, i: usize) -> bool {
    (*p.add(i / 8) >> (i % 8)) & 1 == 1
}

unsafe fn col_of(fmt: &str, a: &FfiArray, parent_offset: usize, len: usize) -> PyResult<Col> {
    let base = parent_offset + a.offset as usize;
    if (a.length as usize) < len.saturating_sub(parent_offset) && fmt != "n" {
        return Err(bad("arrow: a column shorter than its batch"));
    }
    let validity = if a.null_count == 0 { std::ptr::null() } else { buffer(a, 0) };
    let kind = match fmt {
        "n" => Kind::Null,
        "b" => Kind::Bool,
        "c" => Kind::I8,
        "C" => Kind::U8,
        "s" => Kind::I16,
        "S" => Kind::U16,
        "i" => Kind::I32,
        "I" => Kind::U32,
        "l" => Kind::I64,
        "f" => Kind::F32,
        "g" => Kind::F64,
        "u" => Kind::Utf8,
        "U" => Kind::LargeUtf8,
        other => return Err(bad(&format!("arrow: column type {other:?} is not read by the core"))),
    };
    let (data, offsets) = match kind {
        Kind::Null => (std::ptr::null(), std::ptr::null()),
        Kind::Utf8 | Kind::LargeUtf8 => (buffer(a, 2), buffer(a, 1)),
        _ => (buffer(a, 1), std::ptr::null()),
    };
    if len > 0 && kind != Kind::Null && (data.is_null() && kind != Kind::Utf8 && kind != Kind::LargeUtf8 || (offsets.is_null() && matches!(kind, Kind::Utf8 | Kind::LargeUtf8))) {
        return Err(bad("arrow: a column without values"));
    }
    let intern = matches!(kind, Kind::Utf8 | Kind::LargeUtf8).then(Intern::default);
    Ok(Col { kind, validity, data, offsets, base, intern: std::cell::RefCell::new(intern), seen: std::cell::Cell::new(0), last: std::cell::Cell::new(u32::MAX) })
}

pub fn read_batch<'py>(batch: &Bound<'py, PyAny>) -> PyResult<Batch<'py>> {
    let pair = batch.call_method0("__arrow_c_array__")?;
    let sc = pair.get_item(0)?;
    let ac = pair.get_item(1)?;
    let sc = sc.downcast::<PyCapsule>()?;
    let ac = ac.downcast::<PyCapsule>()?;
    // SAFETY: the capsules hold an ArrowSchema and an ArrowArray (their names say so) that stay
    // valid while the capsules live; only read here.
    unsafe {
        let schema = &*(sc.pointer() as *const FfiSchema);
        let array = &*(ac.pointer() as *const FfiArray);
        if cstr(schema.format) != "+s" || schema.n_children != array.n_children {
            return Err(bad("arrow: not a record batch (struct array)"));
        }
        let len = array.length as usize;
        let parent_offset = array.offset as usize;
        if array.null_count > 0 {
            return Err(bad("arrow: a struct array with null rows"));
        }
        let mut names = Vec::new();
        let mut cols = Vec::new();
        for i in 0..schema.n_children as usize {
            let cs = &**schema.children.add(i);
            let ca = &**array.children.add(i);
            if !cs.dictionary.is_null() {
                return Err(bad("arrow: dictionary-encoded columns are not read by the core"));
            }
            names.push(cstr(cs.name));
            cols.push(col_of(&cstr(cs.format), ca, parent_offset, len)?);
        }
        Ok(Batch { names, cols, len, _keep: pair })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interned(col: &Col, text: &str) -> Arc<str> {
        col.interned(text.as_bytes()).expect("UTF-8")
    }

    fn string_col() -> Col {
        Col {
            kind: Kind::Utf8,
            validity: std::ptr::null(),
            data: std::ptr::null(),
            offsets: std::ptr::null(),
            base: 0,
            intern: std::cell::RefCell::new(Some(Intern::default())),
            seen: std::cell::Cell::new(0),
            last: std::cell::Cell::new(u32::MAX),
        }
    }

    #[test]
    fn equal_strings_share_one_value_through_the_last_and_the_map() {
        let col = string_col();
        let a = interned(&col, "card-1");
        assert!(Arc::ptr_eq(&a, &interned(&col, "card-1")), "the last value");
        let b = interned(&col, "card-2");
        assert!(Arc::ptr_eq(&a, &interned(&col, "card-1")), "from the map after another value");
        assert!(Arc::ptr_eq(&b, &interned(&col, "card-2")));
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!((&*a, &*b), ("card-1", "card-2"));
    }

    #[test]
    fn a_column_of_mostly_distinct_values_stops_interning() {
        let col = string_col();
        for i in 0..9000 {
            assert_eq!(&*interned(&col, &format!("v{i}")), format!("v{i}"));
        }
        assert!(col.intern.borrow().is_none());
        let (x, y) = (interned(&col, "v1"), interned(&col, "v1"));
        assert_eq!((&*x, &*y), ("v1", "v1"));
        assert!(!Arc::ptr_eq(&x, &y), "no longer shared");
    }

    #[test]
    fn bytes_that_are_not_utf8_give_none_whether_or_not_the_column_interns() {
        let col = string_col();
        assert!(col.interned(b"\xff\xfe").is_none());
        assert_eq!(&*interned(&col, "DE"), "DE");
        assert!(col.interned(b"D\xc3").is_none(), "the last value's length and first byte, not its bytes");
        *col.intern.borrow_mut() = None;
        assert!(col.interned(b"\xff").is_none());
        assert_eq!(&*interned(&col, "FR"), "FR");
    }
}
