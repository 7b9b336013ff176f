//! Reading a pyarrow `RecordBatch` through the Arrow C data interface (`__arrow_c_array__`:
//! a struct array with one child per column), without the `arrow` crate: the two C structs
//! are fixed by the Arrow specification. Columns of the types below become `Value`s; any other
//! type raises `Unsupported` (the caller then converts the batch in Python).
//!
//! The capsules own the exported structs and release them when they are dropped; everything
//! is copied out while they are alive.

use std::ffi::{c_char, c_void, CStr};

use pyo3::prelude::*;
use pyo3::types::PyCapsule;

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

/// A batch as named columns of values.
pub struct Batch {
    pub names: Vec<String>,
    pub cols: Vec<Vec<Value>>,
    pub len: usize,
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

unsafe fn read_col(fmt: &str, a: &FfiArray, parent_offset: usize, len: usize) -> PyResult<Vec<Value>> {
    let base = parent_offset + a.offset as usize;
    if (a.length as usize) < len.saturating_sub(parent_offset) && fmt != "n" {
        return Err(bad("arrow: a column shorter than its batch"));
    }
    let validity = if a.null_count == 0 { std::ptr::null() } else { buffer(a, 0) };
    let valid = |j: usize| validity.is_null() || bit(validity, base + j);
    let mut out = Vec::with_capacity(len);
    macro_rules! prim {
        ($t:ty, $conv:expr) => {{
            let data = buffer(a, 1) as *const $t;
            if data.is_null() && len > 0 {
                return Err(bad("arrow: a column without values"));
            }
            for j in 0..len {
                out.push(if valid(j) { $conv(std::ptr::read_unaligned(data.add(base + j))) } else { Value::Null });
            }
        }};
    }
    match fmt {
        "n" => out.resize(len, Value::Null),
        "b" => {
            let data = buffer(a, 1);
            for j in 0..len {
                out.push(if valid(j) { Value::Bool(bit(data, base + j)) } else { Value::Null });
            }
        }
        "c" => prim!(i8, |v: i8| Value::Int(v as i64)),
        "C" => prim!(u8, |v: u8| Value::Int(v as i64)),
        "s" => prim!(i16, |v: i16| Value::Int(v as i64)),
        "S" => prim!(u16, |v: u16| Value::Int(v as i64)),
        "i" => prim!(i32, |v: i32| Value::Int(v as i64)),
        "I" => prim!(u32, |v: u32| Value::Int(v as i64)),
        "l" => prim!(i64, Value::Int),
        "f" => prim!(f32, |v: f32| Value::Float(v as f64)),
        "g" => prim!(f64, Value::Float),
        "u" | "U" => {
            let offsets = buffer(a, 1);
            let data = buffer(a, 2);
            for j in 0..len {
                if !valid(j) {
                    out.push(Value::Null);
                    continue;
                }
                let (start, end) = if fmt == "u" {
                    let o = offsets as *const i32;
                    (std::ptr::read_unaligned(o.add(base + j)) as usize, std::ptr::read_unaligned(o.add(base + j + 1)) as usize)
                } else {
                    let o = offsets as *const i64;
                    (std::ptr::read_unaligned(o.add(base + j)) as usize, std::ptr::read_unaligned(o.add(base + j + 1)) as usize)
                };
                let bytes = std::slice::from_raw_parts(data.add(start), end - start);
                let text = std::str::from_utf8(bytes).map_err(|_| bad("arrow: a string that is not UTF-8"))?;
                out.push(Value::Str(std::sync::Arc::from(text)));
            }
        }
        other => return Err(bad(&format!("arrow: column type {other:?} is not read by the core"))),
    }
    Ok(out)
}

/// Every column of a pyarrow RecordBatch (or anything with `__arrow_c_array__` exporting a
/// struct array).
pub fn read_batch(batch: &Bound<'_, PyAny>) -> PyResult<Batch> {
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
            cols.push(read_col(&cstr(cs.format), ca, parent_offset, len)?);
        }
        Ok(Batch { names, cols, len })
    }
}
