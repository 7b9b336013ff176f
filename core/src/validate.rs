//! A fast path of the event validator (`cep.events.validate_text`) for replay's first step: the
//! common record (strict JSON, a well-typed event with an integer time, string or integer keys)
//! is checked here, and its time, keys and content seq (`cep.runtime.engine.content_seq`:
//! BLAKE2b-64 of `json.dumps(event, sort_keys=True, separators=(",", ":"))`) computed, with no
//! Python object per record.
//!
//! It only ever *accepts*: a record it is not sure of (a `\u` escape, an ISO time, a float
//! INT, a number that does not fit 64 bits, a repeated field, a wrong type, bad UTF-8, too
//! deep, ...) is left to the Python validator, which gives the reason or converts the event.
//! So the Python validator stays the one definition of a valid event; this module must only
//! agree with it on what it accepts (tests/core/test_validate_fast.py checks it against the
//! Python validator and `content_seq` on generated records).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

const MAX_DEPTH: usize = 32;
const MIN_TS: i64 = -62_135_596_800_000;
const MAX_TS: i64 = 253_402_300_799_000;

enum J {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

/// A strict JSON reader for the subset above; `None`: leave the record to Python.
struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Option<J> {
        self.ws();
        match *self.b.get(self.i)? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(J::Str),
            b't' => self.word(b"true", J::Bool(true)),
            b'f' => self.word(b"false", J::Bool(false)),
            b'n' => self.word(b"null", J::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn word(&mut self, w: &[u8], v: J) -> Option<J> {
        if self.b[self.i..].starts_with(w) {
            self.i += w.len();
            Some(v)
        } else {
            None
        }
    }

    fn object(&mut self, depth: usize) -> Option<J> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.i += 1;
        let mut out: Vec<(String, J)> = Vec::new();
        self.ws();
        if self.b.get(self.i) == Some(&b'}') {
            self.i += 1;
            return Some(J::Obj(out));
        }
        loop {
            self.ws();
            if self.b.get(self.i) != Some(&b'"') {
                return None;
            }
            let k = self.string()?;
            if out.iter().any(|(n, _)| *n == k) {
                return None; // a repeated field: Python's rules (last value, first place)
            }
            self.ws();
            if self.b.get(self.i) != Some(&b':') {
                return None;
            }
            self.i += 1;
            let v = self.value(depth)?;
            out.push((k, v));
            self.ws();
            match self.b.get(self.i)? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(J::Obj(out));
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<J> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.i += 1;
        let mut out = Vec::new();
        self.ws();
        if self.b.get(self.i) == Some(&b']') {
            self.i += 1;
            return Some(J::Arr(out));
        }
        loop {
            out.push(self.value(depth)?);
            self.ws();
            match self.b.get(self.i)? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(J::Arr(out));
                }
                _ => return None,
            }
        }
    }

    /// A string without `\u` escapes or control characters (the input is valid UTF-8).
    fn string(&mut self) -> Option<String> {
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let c = *self.b.get(self.i)?;
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let e = *self.b.get(self.i)?;
                    self.i += 1;
                    out.push(match e {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 8,
                        b'f' => 12,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        _ => return None,
                    });
                }
                0..=0x1f => return None,
                _ => out.push(c),
            }
        }
    }

    /// Python's number grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`; an integer
    /// (no fraction, no exponent) must fit i64, a float must be finite.
    fn number(&mut self) -> Option<J> {
        let start = self.i;
        let b = self.b;
        let digits = |i: &mut usize| {
            let s = *i;
            while *i < b.len() && b[*i].is_ascii_digit() {
                *i += 1;
            }
            *i - s
        };
        let mut i = self.i;
        if b[i] == b'-' {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                digits(&mut i);
            }
            _ => return None,
        }
        let mut float = false;
        if b.get(i) == Some(&b'.') && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            i += 1;
            digits(&mut i);
            float = true;
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            let mut j = i + 1;
            if matches!(b.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            if digits(&mut j) > 0 {
                i = j;
                float = true;
            }
        }
        self.i = i;
        let text = std::str::from_utf8(&b[start..i]).ok()?;
        if float {
            let f: f64 = text.parse().ok()?;
            f.is_finite().then_some(J::Float(f))
        } else {
            text.parse::<i64>().ok().map(J::Int)
        }
    }
}

/// A declared field type (`cep.events.EventSchema.fields`).
enum Ty {
    Str,
    Int,
    Float,
    Bool,
    Other,
    Struct(Vec<(String, Ty)>),
}

fn fields_of(spec: &Bound<'_, PyAny>) -> PyResult<Vec<(String, Ty)>> {
    let mut out = Vec::new();
    for item in spec.try_iter()? {
        let pair = item?;
        let pair = pair.downcast::<PyTuple>()?;
        let name: String = pair.get_item(0)?.extract()?;
        let t = pair.get_item(1)?;
        let ty = if let Ok(s) = t.extract::<String>() {
            match s.as_str() {
                "STRING" => Ty::Str,
                "INT" => Ty::Int,
                "FLOAT" => Ty::Float,
                "BOOL" => Ty::Bool,
                _ => Ty::Other,
            }
        } else {
            Ty::Struct(fields_of(&t)?)
        };
        out.push((name, ty));
    }
    Ok(out)
}

fn get<'a>(obj: &'a [(String, J)], name: &str) -> Option<&'a J> {
    obj.iter().find(|(n, _)| n == name).map(|(_, v)| v)
}

/// The declared fields hold their types as they are (no conversion needed).
fn typed(obj: &[(String, J)], fields: &[(String, Ty)], tf: Option<&str>) -> bool {
    fields.iter().all(|(name, ty)| {
        if Some(name.as_str()) == tf {
            return true;
        }
        match (get(obj, name), ty) {
            (None | Some(J::Null), _) | (_, Ty::Other) => true,
            (Some(J::Str(_)), Ty::Str) | (Some(J::Int(_)), Ty::Int | Ty::Float) => true,
            (Some(J::Float(_)), Ty::Float) | (Some(J::Bool(_)), Ty::Bool) => true,
            (Some(J::Obj(inner)), Ty::Struct(f)) => typed(inner, f, None),
            _ => false,
        }
    })
}

/// `json.dumps(v, sort_keys=True, separators=(",", ":"))` (ensure_ascii, `float.__repr__`).
fn dump(v: &J, out: &mut String) {
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Int(n) => out.push_str(&n.to_string()),
        J::Float(f) => float_repr(*f, out),
        J::Str(s) => dump_str(s, out),
        J::Arr(items) => {
            out.push('[');
            for (k, x) in items.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                dump(x, out);
            }
            out.push(']');
        }
        J::Obj(fields) => {
            let mut order: Vec<&(String, J)> = fields.iter().collect();
            order.sort_by(|a, b| a.0.cmp(&b.0)); // UTF-8 byte order = code point order
            out.push('{');
            for (k, (name, x)) in order.into_iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                dump_str(name, out);
                out.push(':');
                dump(x, out);
            }
            out.push('}');
        }
    }
}

fn unit(u: u16, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push_str("\\u");
    for shift in [12, 8, 4, 0] {
        out.push(HEX[((u >> shift) & 0xf) as usize] as char);
    }
}

fn dump_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    unit(*u, out);
                }
            }
        }
    }
    out.push('"');
}

/// The number of digits after the point in the exact decimal expansion of (finite) `f`: `f`
/// is `m * 2^e` with `m` odd, and `2^-k` has exactly `k` of them.
fn exact_frac_digits(f: f64) -> usize {
    let bits = f.to_bits();
    let (mant, exp) = (bits & ((1 << 52) - 1), ((bits >> 52) & 0x7ff) as i32);
    let (m, e) = if exp == 0 { (mant, -1074) } else { (mant | 1 << 52, exp - 1075) };
    if m == 0 {
        return 0;
    }
    (-(e + m.trailing_zeros() as i32)).max(0) as usize
}

/// Python's `repr(float)`: the shortest digits that read back as `f`, positional when the
/// decimal exponent is in [-4, 16), else `d.ddde±XX`.
fn float_repr(f: f64, out: &mut String) {
    use std::fmt::Write;
    // Rust's shortest digits break a tie between two shortest forms upward, Python's repr to
    // even (764461555359037.25: Rust `.3`, Python `.2`): the positional form is written again
    // only when it can be a tie, the scientific form always, exactly at as many digits (Rust's
    // fixed precision rounds ties to even); that one is kept when it differs and still reads
    // back as `f`.
    if f == 0.0 || (1e-4..1e16).contains(&f.abs()) {
        // Positional range (the usual amount or price): `Debug` writes these digits with
        // Python's `.0` rule, with no allocation.
        let start = out.len();
        let _ = write!(out, "{f:?}");
        let mid = out.len();
        let frac = out[start..mid].split_once('.').map_or(0, |(_, d)| d.len());
        // A tie needs `f` exactly halfway between two `frac`-digit decimals: its exact
        // expansion is then one digit longer. Any other float is written once.
        if exact_frac_digits(f) != frac + 1 {
            return;
        }
        let _ = write!(out, "{f:.frac$}");
        if out[mid..] != out[start..mid] && out[mid..].parse::<f64>() == Ok(f) {
            out.replace_range(start..mid, "");
        } else {
            out.truncate(mid);
        }
        return;
    }
    let mut sci = format!("{f:e}"); // shortest round-trip digits: "-1.2345e-7"
    let n = sci.split('e').next().unwrap_or("").bytes().filter(u8::is_ascii_digit).count();
    let even = format!("{f:.p$e}", p = n.saturating_sub(1));
    if even != sci && even.parse::<f64>() == Ok(f) {
        sci = even;
    }
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mant) = mant.strip_prefix('-').map_or((false, mant), |m| (true, m));
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    if neg {
        out.push('-');
    }
    let decpt = exp + 1;
    let n = digits.len() as i32;
    if decpt <= -4 || decpt > 16 {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.abs()));
    } else if decpt <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-decpt) as usize));
        out.push_str(&digits);
    } else if decpt >= n {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (decpt - n) as usize));
        out.push_str(".0");
    } else {
        out.push_str(&digits[..decpt as usize]);
        out.push('.');
        out.push_str(&digits[decpt as usize..]);
    }
}

const IV: [u64; 8] = [
    0x6a09e667f3bcc908,
    0xbb67ae8584caa73b,
    0x3c6ef372fe94f82b,
    0xa54ff53a5f1d36f1,
    0x510e527fade682d1,
    0x9b05688c2b3e6c1f,
    0x1f83d9abfb41bd6b,
    0x5be0cd19137e2179,
];

const SIGMA: [[usize; 16]; 10] = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
    [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
    [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
    [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
    [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
    [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
    [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
    [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
    [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
];

fn compress(h: &mut [u64; 8], block: &[u8; 128], t: u128, last: bool) {
    let mut m = [0u64; 16];
    for (k, w) in m.iter_mut().enumerate() {
        *w = u64::from_le_bytes(block[8 * k..8 * k + 8].try_into().unwrap_or([0; 8]));
    }
    let mut v = [0u64; 16];
    v[..8].copy_from_slice(h);
    v[8..].copy_from_slice(&IV);
    v[12] ^= t as u64;
    v[13] ^= (t >> 64) as u64;
    if last {
        v[14] = !v[14];
    }
    let g = |v: &mut [u64; 16], a: usize, b: usize, c: usize, d: usize, x: u64, y: u64| {
        v[a] = v[a].wrapping_add(v[b]).wrapping_add(x);
        v[d] = (v[d] ^ v[a]).rotate_right(32);
        v[c] = v[c].wrapping_add(v[d]);
        v[b] = (v[b] ^ v[c]).rotate_right(24);
        v[a] = v[a].wrapping_add(v[b]).wrapping_add(y);
        v[d] = (v[d] ^ v[a]).rotate_right(16);
        v[c] = v[c].wrapping_add(v[d]);
        v[b] = (v[b] ^ v[c]).rotate_right(63);
    };
    for r in 0..12 {
        let s = &SIGMA[r % 10];
        g(&mut v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
        g(&mut v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
        g(&mut v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
        g(&mut v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
        g(&mut v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
        g(&mut v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
        g(&mut v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
        g(&mut v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (k, x) in h.iter_mut().enumerate() {
        *x ^= v[k] ^ v[k + 8];
    }
}

/// BLAKE2b with an 8-byte digest and no key, read as a big-endian signed integer (what
/// `content_seq` does with `hashlib.blake2b(raw, digest_size=8)`).
pub fn blake2b_64(data: &[u8]) -> i64 {
    let mut h = IV;
    h[0] ^= 0x0101_0000 ^ 8;
    let mut t: u128 = 0;
    let mut rest = data;
    while rest.len() > 128 {
        t += 128;
        let block: &[u8; 128] = rest[..128].try_into().unwrap_or(&[0; 128]);
        compress(&mut h, block, t, false);
        rest = &rest[128..];
    }
    let mut block = [0u8; 128];
    block[..rest.len()].copy_from_slice(rest);
    t += rest.len() as u128;
    compress(&mut h, &block, t, true);
    i64::from_be_bytes(h[0].to_le_bytes())
}

/// One record: `Some((ts, keys, the parsed object))` when the fast path accepts it.
fn check(raw: &[u8], tf: &str, keys: &[String], fields: Option<&[(String, Ty)]>,
         max_bytes: usize) -> Option<(i64, Vec<String>, J)> {
    if raw.is_empty() || raw.len() > max_bytes || std::str::from_utf8(raw).is_err() {
        return None;
    }
    // Python walks the values only when these scans cannot rule a problem out: leave those.
    // (`contains` first: a memchr, where the pairwise scan was a tenth of the validator's time)
    if (raw.contains(&b'\\') && raw.windows(2).any(|w| w == b"\\u"))
        || raw.iter().filter(|&&c| c == b'{' || c == b'[').count() > MAX_DEPTH
    {
        return None;
    }
    let mut r = Reader { b: raw, i: 0 };
    r.ws();
    if r.b.get(r.i) != Some(&b'{') {
        return None;
    }
    let value = r.value(0)?;
    r.ws();
    if r.i != raw.len() {
        return None;
    }
    let J::Obj(obj) = &value else { return None };
    let ts = match get(obj, tf) {
        Some(J::Int(t)) if (MIN_TS..MAX_TS).contains(t) => *t,
        _ => return None,
    };
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        if k.is_empty() {
            out.push(String::new());
            continue;
        }
        out.push(match get(obj, k)? {
            J::Str(s) => s.clone(),
            J::Int(n) => n.to_string(),
            _ => return None,
        });
    }
    if let Some(f) = fields {
        if !typed(obj, f, Some(tf)) {
            return None;
        }
    }
    Some((ts, out, value))
}

/// The content seq of a parsed value: BLAKE2b of its canonical text (`capacity`: the text's
/// likely length).
fn seq_of(value: &J, capacity: usize) -> i64 {
    let mut text = String::with_capacity(capacity);
    dump(value, &mut text);
    blake2b_64(text.as_bytes())
}

/// `validate_fast(values, time_field, key_order, fields, max_bytes, content_seq=True)`: for each
/// record (bytes or None), whether the fast path accepts it, and if so its time, keys (in
/// `key_order`; an empty name gives an empty key) and content seq. Returns `(ok, ts, seq,
/// key_offsets, key_data)` as bytes: one u8 per record, i64 (native order) per record, and the
/// keys as an Arrow string array's int32 offsets and data, `len(key_order)` per record (empty
/// for a record left to Python). `content_seq` false (the live job, which orders by Kafka
/// position) leaves out the canonical text and its hash: `seq` is then None (no seqs that could
/// be taken for real ones), the rest is the same.
#[pyfunction]
#[pyo3(signature = (values, time_field, key_order, fields, max_bytes, content_seq=true))]
pub fn validate_fast<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyList>,
    time_field: &str,
    key_order: Vec<String>,
    fields: Option<Bound<'py, PyAny>>,
    max_bytes: usize,
    content_seq: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    let fields = fields.map(|f| fields_of(&f)).transpose()?;
    let n = values.len();
    let k = key_order.len();
    let mut ok = vec![0u8; n];
    let mut ts = Vec::with_capacity(8 * n);
    let mut seq = content_seq.then(|| Vec::with_capacity(8 * n));
    let mut offsets: Vec<u8> = Vec::with_capacity(4 * (n * k + 1));
    let mut data: Vec<u8> = Vec::new();
    offsets.extend_from_slice(&0i32.to_ne_bytes());
    for (j, item) in values.iter().enumerate() {
        let got = if item.is_none() {
            None
        } else {
            let raw = item.downcast::<PyBytes>()?.as_bytes();
            check(raw, time_field, &key_order, fields.as_deref(), max_bytes).map(|(t, keys, v)| {
                (t, keys, if content_seq { seq_of(&v, raw.len() + 16) } else { 0 })
            })
        };
        let (t, q) = match got {
            Some((t, keys, q)) => {
                ok[j] = 1;
                for key in keys {
                    data.extend_from_slice(key.as_bytes());
                    let end = i32::try_from(data.len())
                        .map_err(|_| PyValueError::new_err("validate_fast: keys over 2 GiB"))?;
                    offsets.extend_from_slice(&end.to_ne_bytes());
                }
                (t, q)
            }
            None => {
                let end = i32::try_from(data.len()).unwrap_or(i32::MAX);
                for _ in 0..k {
                    offsets.extend_from_slice(&end.to_ne_bytes());
                }
                (0, 0)
            }
        };
        ts.extend_from_slice(&t.to_ne_bytes());
        if let Some(seq) = &mut seq {
            seq.extend_from_slice(&q.to_ne_bytes());
        }
    }
    let bytes = |b: &[u8]| PyBytes::new(py, b);
    (bytes(&ok), bytes(&ts), seq.as_deref().map(bytes), bytes(&offsets), bytes(&data)).into_pyobject(py)
}

/// `content_seq_of(text)`: the fast path's content seq of one JSON object's text, or None when
/// it would leave the record to Python (for tests).
#[pyfunction]
pub fn content_seq_of(text: &[u8]) -> Option<i64> {
    let mut r = Reader { b: text, i: 0 };
    Some(seq_of(&r.value(0)?, text.len()))
}

// -- the live job's shard of a key, as Spark computes it -------------------------------------

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;
/// Spark's seed for `xxhash64(...)` (`XxHash64` in catalyst's hash expressions).
const SPARK_SEED: u64 = 42;

fn xxh_round(acc: u64, lane: u64) -> u64 {
    acc.wrapping_add(lane.wrapping_mul(P2)).rotate_left(31).wrapping_mul(P1)
}

fn xxh_merge(acc: u64, v: u64) -> u64 {
    (acc ^ xxh_round(0, v)).wrapping_mul(P1).wrapping_add(P4)
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// XXH64 of `data` with `seed` (the reference algorithm; Spark's `XXH64.hashUnsafeBytes` is it,
/// reading little-endian words).
fn xxh64(data: &[u8], seed: u64) -> u64 {
    let mut rest = data;
    let mut h = if data.len() >= 32 {
        let mut v = [seed.wrapping_add(P1).wrapping_add(P2), seed.wrapping_add(P2), seed,
                     seed.wrapping_sub(P1)];
        while rest.len() >= 32 {
            for (i, acc) in v.iter_mut().enumerate() {
                *acc = xxh_round(*acc, le64(&rest[8 * i..]));
            }
            rest = &rest[32..];
        }
        let mut h = v[0].rotate_left(1).wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12)).wrapping_add(v[3].rotate_left(18));
        for lane in v {
            h = xxh_merge(h, lane);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(data.len() as u64);
    while rest.len() >= 8 {
        h = (h ^ xxh_round(0, le64(rest))).rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
        rest = &rest[8..];
    }
    if rest.len() >= 4 {
        let w = u64::from(u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")));
        h = (h ^ w.wrapping_mul(P1)).rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        rest = &rest[4..];
    }
    for &b in rest {
        h = (h ^ u64::from(b).wrapping_mul(P5)).rotate_left(11).wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

/// `spark_shards(field, offsets, data, shards)`: for each string of an Arrow string array
/// (its int32 offsets, native order, and data; no nulls), the shard Spark gives the pair
/// `pmod(xxhash64(field, string), shards)`, as int32 (native order). The live job's single
/// Python pass shards its rows with it, and a key's shard is part of its checkpointed state,
/// so it must be Spark's own (tests/test_live_pass.py checks it against Spark).
#[pyfunction]
pub fn spark_shards<'py>(
    py: Python<'py>,
    field: &str,
    offsets: &[u8],
    data: &[u8],
    shards: i64,
) -> PyResult<Bound<'py, PyBytes>> {
    if shards < 1 || shards > i64::from(i32::MAX) {
        return Err(PyValueError::new_err(format!("spark_shards: shards={shards}")));
    }
    if offsets.len() % 4 != 0 || offsets.is_empty() {
        return Err(PyValueError::new_err("spark_shards: offsets are not int32s"));
    }
    let offs: Vec<usize> = offsets
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes(c.try_into().expect("4 bytes")))
        .map(|o| usize::try_from(o).map_err(|_| PyValueError::new_err("spark_shards: offset")))
        .collect::<PyResult<_>>()?;
    let seed = xxh64(field.as_bytes(), SPARK_SEED);
    let mut out = Vec::with_capacity(4 * (offs.len() - 1));
    for w in offs.windows(2) {
        let s = data
            .get(w[0]..w[1])
            .ok_or_else(|| PyValueError::new_err("spark_shards: offsets past the data"))?;
        // Spark's xxhash64 is a signed long; pmod keeps the result in 0..shards.
        let shard = (xxh64(s, seed) as i64).rem_euclid(shards) as i32;
        out.extend_from_slice(&shard.to_ne_bytes());
    }
    Ok(PyBytes::new(py, &out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        for (f, want) in [(0.0, "0.0"), (-0.0, "-0.0"), (1.5, "1.5"), (1e16, "1e+16"),
                          (1e15, "1000000000000000.0"), (0.0001, "0.0001"), (1e-5, "1e-05"),
                          (123.456, "123.456"), (1.2345678901234568e17, "1.2345678901234568e+17"),
                          (5e-324, "5e-324"), (0.1, "0.1"),
                          // ties between two shortest forms go to the even digit, as in Python
                          (764461555359037.0 + 0.25, "764461555359037.2"), (2.5e20, "2.5e+20")] {
            let mut s = String::new();
            float_repr(f, &mut s);
            assert_eq!(s, want);
        }
    }

    #[test]
    fn exact_frac_digits_counts_the_digits_of_the_exact_value() {
        for (f, n) in [(0.0, 0), (1.0, 0), (1e15, 0), (0.5, 1), (0.25, 2), (0.125, 3), (-0.375, 3),
                       (764461555359037.0 + 0.25, 2), (0.1, 55), (5e-324, 1074)] {
            assert_eq!(exact_frac_digits(f), n, "{f:?}");
        }
    }

    /// The premise of `float_repr`'s one write: a positional float whose exact expansion is not
    /// one digit longer than its shortest form has that form as its correctly rounded one too.
    #[test]
    fn shortest_digits_are_the_rounded_ones_unless_a_tie_is_possible() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut checked = 0;
        for k in 0..300_000 {
            let r = next();
            // Random bit patterns, and values with few fraction bits (where ties are).
            let f = if k % 2 == 0 { f64::from_bits(r) } else { (r >> 11) as f64 / (1u64 << (r % 50)) as f64 };
            if !(f == 0.0 || (1e-4..1e16).contains(&f.abs())) {
                continue;
            }
            let short = format!("{f:?}");
            let frac = short.split_once('.').map_or(0, |(_, d)| d.len());
            if exact_frac_digits(f) != frac + 1 {
                assert_eq!(format!("{f:.frac$}"), short);
                checked += 1;
            }
        }
        assert!(checked > 100_000);
    }

    #[test]
    fn xxh64_known_values() {
        // The reference implementation's published values (xxhsum -H64; seed 0).
        assert_eq!(xxh64(b"", 0), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"a", 0), 0xD24E_C4F1_A98C_6E5B);
        assert_eq!(xxh64(b"abc", 0), 0x44BC_2CF5_AD77_0999);
    }

    #[test]
    fn blake2b_known_value() {
        // hashlib.blake2b(b"", digest_size=8).digest() = e4a6a0577479b2b4
        assert_eq!(blake2b_64(b""), i64::from_be_bytes(0xe4a6a0577479b2b4u64.to_be_bytes()));
    }
}
