//! A log row as the native shard store keeps it (cep/runtime/state_store.py, layout 3, since
//! session 16): the magic `CEPNZ`, the blob's length as a u32 (little-endian), then the blob
//! (`Engine.export_blobs`: `CEPNB` ...) as one zstd frame, level 1. Written and read here by
//! `Engine.export_rows` / `Engine.import_row` (session 23): the same bytes as the store's
//! Python `zip_row` / `unzip_row` (pyarrow's zstd), so either reads the other's rows, but one
//! compression context kept per thread (the simple API, as pyarrow calls it, makes one per
//! row) and no bytes object for the raw blob.

use std::cell::RefCell;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

pub const ROW_MAGIC: &[u8; 5] = b"CEPNZ";
const HEAD: usize = ROW_MAGIC.len() + 4;
/// The store's level since session 16 (faster levels measured no faster: docs/spark-runtime.md).
const LEVEL: i32 = 1;

thread_local! {
    /// The compression context and its output buffer, kept for the thread's next row.
    static ZIP: RefCell<Option<(zstd::bulk::Compressor<'static>, Vec<u8>)>> = const { RefCell::new(None) };
    /// The decompression context and the expanded blob's buffer, likewise.
    static UNZIP: RefCell<Option<(zstd::bulk::Decompressor<'static>, Vec<u8>)>> = const { RefCell::new(None) };
}

fn zstd_error(e: std::io::Error) -> PyErr {
    PyRuntimeError::new_err(format!("zstd: {e}"))
}

/// `blob` as a stored row (a new bytes object).
pub fn zip_row<'py>(py: Python<'py>, blob: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let size = u32::try_from(blob.len()).map_err(|_| PyValueError::new_err("native key-state blob over 4 GB"))?;
    // Taken out of the cell while in use (put back after): no borrow held across a call out.
    let (mut cx, mut out) = match ZIP.with(|z| z.borrow_mut().take()) {
        Some(kept) => kept,
        None => (zstd::bulk::Compressor::new(LEVEL).map_err(zstd_error)?, Vec::new()),
    };
    out.clear();
    out.reserve(zstd::zstd_safe::compress_bound(blob.len()));
    let done = cx.compress_to_buffer(blob, &mut out).map_err(zstd_error);
    let row = done.and_then(|n| {
        PyBytes::new_with(py, HEAD + n, |buf| {
            buf[..ROW_MAGIC.len()].copy_from_slice(ROW_MAGIC);
            buf[ROW_MAGIC.len()..HEAD].copy_from_slice(&size.to_le_bytes());
            buf[HEAD..].copy_from_slice(&out[..n]);
            Ok(())
        })
    });
    ZIP.with(|z| *z.borrow_mut() = Some((cx, out)));
    row
}

/// `f` of the blob of a stored row: the row itself when it is not compressed (layout 2's raw
/// rows), else the row expanded into a buffer kept for the thread's next row.
pub fn with_blob<T>(row: &[u8], f: impl FnOnce(&[u8]) -> PyResult<T>) -> PyResult<T> {
    if !row.starts_with(ROW_MAGIC) {
        return f(row);
    }
    let corrupt = |why: String| {
        PyValueError::new_err(format!(
            "native key-state log row: a compressed row that does not expand ({why}): the \
             checkpoint's state is corrupt; reset it or replay the input"
        ))
    };
    let size = row.get(ROW_MAGIC.len()..HEAD).ok_or_else(|| corrupt("truncated header".into()))?;
    let size = u32::from_le_bytes(size.try_into().expect("4 bytes")) as usize;
    let (mut cx, mut buf) = match UNZIP.with(|z| z.borrow_mut().take()) {
        Some(kept) => kept,
        None => (zstd::bulk::Decompressor::new().map_err(zstd_error)?, Vec::new()),
    };
    buf.clear();
    buf.reserve(size);
    let got = match cx.decompress_to_buffer(&row[HEAD..], &mut buf) {
        Ok(n) if n == size => f(&buf[..n]),
        Ok(n) => Err(corrupt(format!("{n} bytes, its header says {size}"))),
        Err(e) => Err(corrupt(e.to_string())),
    };
    // A buffer grown for a large row (a compaction's) is not kept past 16 MB.
    if buf.capacity() <= 16 << 20 {
        UNZIP.with(|z| *z.borrow_mut() = Some((cx, buf)));
    }
    got
}
