//! The engine loop of `cep/runtime/engine.py` (that file is the specification), for a rule set
//! whose rules all run on the native matcher: routing events to their key's state, the per-key
//! event buffer and its `(ts, seq)` order, release at the safe time, deadlines and the wake
//! index (with `AT_END`), end of input, late events, and state release.
//!
//! `Engine` holds the rules (one `Core` each) and their groups (rules that read one stream and
//! partition by one key field share a key's state); `EngineState` holds the keys' states and the
//! wake index, the native counterpart of `MemoryKeyStore`. A key's state serialises as versioned
//! bytes (`Engine.key_bytes` / `Engine.load_key`).

use std::cmp::Ordering;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::arrow::{read_batch, Batch};
use crate::budget::Budget;
use crate::evcodec::{put_iv, put_str, put_uv, Dec as EvDec};
use crate::json::{parse_row, ColsCache};
use crate::expr::{Cols, Ev, Row, RowRef};
use crate::value::Value;
use crate::family::{self, FOut, FState, Family};
use crate::matcher::{Core, MState, Out, NO_CID};
use crate::pack::Packed;
use crate::keycodec::{self, KeyEnc, Known, Src};
use crate::keys::{prefetch, Id, Keys, TooManyKeys};
use crate::{build_core, panic_message, CoreError};

/// Hash maps (by key id, field name, condition text) with foldhash (seeded per process, much cheaper than SipHash
/// on short keys; SipHash was ~5% of the fraud workload's samples).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

pub const EOF_TS: i64 = 253_402_300_799_000;
pub const AT_END: i64 = EOF_TS - 1;
pub const KEY_MAGIC: &[u8; 5] = b"CEPNK";
pub const KEY_VERSION: u16 = keycodec::VERSION;
/// Key records as the Spark operator stores them (`Engine.export_blobs`), version 2: magic,
/// u16le version, u32le count of records; the known column tables the records' keys may name
/// (uv count, per table uv ncols and the names as uv length + UTF-8); the group ids (uv count,
/// each uv length + UTF-8); then per record: uv group (index in that list), the key (uv length
/// and UTF-8), iv (wake time - the previous record's; the first from 0) and its `CEPNK` bytes
/// (uv length and bytes; none: the key has no state any more). Varints as in `evcodec`.
pub const BLOB_MAGIC: &[u8; 5] = b"CEPNB";
pub const BLOB_VERSION: u16 = 2;
/// No key id (`Engine.ingest_arrow`'s `key_ids`).
const NO_ID: Id = Id::MAX;

/// A buffered event: `(ts, seq, data)` of the Python engine. A row event has no Python objects
/// (`seq` and `data` None): `seqi` and `ev` (or, from a JSON column, `row`) hold it.
struct Item {
    ts: i64,
    seq: Option<Py<PyAny>>,
    /// `seq` when it is a plain int that fits 64 bits: compared without Python.
    seqi: Option<i64>,
    data: Option<Py<PyAny>>,
    /// A row not yet in an `Ev` (a JSON event: its `Ev` is made when the key is advanced).
    row: Option<Box<Row>>,
    /// An event from an Arrow batch: its `Ev`, built when the batch is read (while its row is
    /// in the cache), with the row's values in it (`row` above is then None); a row event read
    /// back from state: the `Ev` the key's parts share (`decode_key`).
    ev: Option<Ev>,
}

impl Item {
    /// The event's row (an event from an Arrow batch or read back from state), with its
    /// identity in the key's event table (`keycodec::Src::Row`): the block holding it.
    fn row(&self) -> Option<(RowRef<'_>, usize)> {
        match (&self.row, &self.ev) {
            (Some(r), _) => Some((r.view(), &**r as *const Row as usize)),
            (None, Some(ev)) => ev.row().map(|r| (r, ev.as_ptr() as usize)),
            (None, None) => None,
        }
    }

    fn seq_obj(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.seq {
            Some(s) => Ok(s.clone_ref(py)),
            None => Ok(self.seqi.unwrap_or(0).into_pyobject(py)?.into_any().unbind()),
        }
    }

    fn data_obj(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match (&self.data, self.row()) {
            (Some(d), _) => Ok(d.clone_ref(py)),
            (None, Some((r, _))) => r.to_dict(py),
            (None, None) => Ok(py.None()),
        }
    }
}

struct Part {
    /// `keycodec::fingerprint` of the rule's id and version.
    fp: u32,
    state: MState,
}

#[derive(Default)]
struct KeyState {
    buffer: Vec<Item>,
    parts: Vec<Part>,
    /// The states of the engine's rule families (`family.rs`) by family index; written to
    /// bytes as their members' parts. A boxed slice (two words, not a vector's three): the key's
    /// slot is then 128 bytes, two cache lines (docs/native-core.md, "Many keys: memory per key").
    fams: Box<[(u32, FState)]>,
}

/// From this many decoded keys on (by default), a key's state is compacted
/// (`KeyState::compact`) each time it is put back: with few keys the spare room is cheap (in
/// cache, reused at the key's next event); with many, each key is a cache miss and its spare
/// room fresh pages to zero.
const COMPACT_FROM: usize = 1 << 16;

impl KeyState {
    /// Give back the spare room of the state's vectors (`MState::compact`).
    fn compact(&mut self) {
        crate::matcher::fit(&mut self.buffer);
        crate::matcher::fit(&mut self.parts);
        for p in &mut self.parts {
            p.state.compact();
        }
    }
}

/// A key's decoded state: live (the matcher's types), or packed at rest (`pack.rs`: with many
/// keys, a key without buffered events or family states, put back after it ran;
/// docs/native-core.md, "Many keys: the packed key (session 18)").
enum Held {
    Live(KeyState),
    Packed(Packed),
}

impl Held {
    /// `ks` packed when it can be (no buffered event, no family state, `Packed::pack`, into the
    /// blocks of `reuse` when they fit), else compacted (`KeyState::compact`).
    fn pack(mut ks: KeyState, reuse: Option<Packed>) -> Held {
        if ks.buffer.is_empty() && ks.fams.is_empty() {
            if let Some(p) = Packed::pack(ks.parts.iter().map(|p| (p.fp, &p.state)), reuse) {
                return Held::Packed(p);
            }
        }
        ks.compact();
        Held::Live(ks)
    }

    /// The live state, and the packing it was unpacked from (its blocks reused when the key is
    /// packed again: docs/native-core.md, "Many keys: the packed key's steady call (session 20)").
    fn into_live(self) -> (KeyState, Option<Packed>) {
        match self {
            Held::Live(ks) => (ks, None),
            Held::Packed(p) => (p.unpack_key(), Some(p)),
        }
    }

    /// `f` of the live state (a packed one unpacked for it: `encode_key`, `wake_again`).
    fn with_live<R>(&self, f: impl FnOnce(&KeyState) -> R) -> R {
        match self {
            Held::Live(ks) => f(ks),
            Held::Packed(p) => f(&p.unpack_key()),
        }
    }

    fn live(&self) -> Option<&KeyState> {
        match self {
            Held::Live(ks) => Some(ks),
            Held::Packed(_) => None,
        }
    }
}

impl Packed {
    fn unpack_key(&self) -> KeyState {
        KeyState { parts: self.unpack(|fp, state| Part { fp, state }), ..KeyState::default() }
    }
}

/// A key's slot in `EngineState::keys`: its decoded state (None while the key is held as bytes
/// in `raw`, or has no state yet) and the events the current call brought it.
#[derive(Default)]
struct KeySlot {
    state: Option<Held>,
    new: Vec<Item>,
}

/// The keys' states and the wake index of one engine (the native `MemoryKeyStore`). A key
/// (group, text) has an integer id while it has state (`keys.rs`): every map here is by id.
#[pyclass(module = "cep._core", name = "EngineState")]
#[derive(Default)]
pub struct EngineState {
    /// The keys, their slots and the wake index (as the Python engine's `Wake`: one time per
    /// key, when it is due).
    keys: Keys<KeySlot>,
    /// The keys the current call brought events to (their `KeySlot::new`).
    arrived: Vec<Id>,
    /// The keys advanced since `Engine.export_blobs` last ran (kept only when `track_dirty`):
    /// what a store that writes changed keys back must write. A dirty key keeps its id until
    /// that export, even with no state left (its record is then a tombstone).
    dirty: HashSet<Id>,
    track_dirty: bool,
    /// Keys read from the store and not needed since: their `CEPNK` bytes, decoded when an
    /// event or a deadline reaches the key (`Engine.import_blob`, `Engine.export_blobs`).
    raw: HashMap<Id, Vec<u8>>,
    /// Decoded keys unchanged since `export_blobs` encoded them: those bytes (reused, not
    /// re-encoded, by the next export that needs them, e.g. a compaction).
    enc: HashMap<Id, Vec<u8>>,
    /// Keys changed since the last export: their bytes as last exported or read (kept only
    /// when `track_dirty`): a key whose new bytes are the same needs no record.
    was: HashMap<Id, Vec<u8>>,
    /// Decoded keys stay decoded after an export while their bytes total at most this much
    /// (the others are held as bytes): `keep_decoded`, or with `adaptive` that or none, as
    /// observed (`budget.rs`).
    budget: Budget,
    /// From this many decoded keys on, a key's state is compacted when it is put back
    /// (`KeyState::compact`; `COMPACT_FROM` unless given).
    compact_from: usize,
    /// The keys whose slot holds a decoded state (`take_state`, `put_state`): with the keys
    /// in `raw` (never both at once) the keys with state, `len()`, without a lookup per key.
    decoded: usize,
    /// The engine this state belongs to (`Engine::ident`, set by the first engine that uses
    /// it): key states are by group index and rule fingerprint, which another rule set reads
    /// as something else.
    engine: Option<u64>,
    /// Column tables named by fingerprint in the blobs read (`import_blob`): a key read from
    /// the store may name a table of an earlier declaration of its stream.
    imported: Known,
    /// `advance_key`'s per-key vectors (the key's events, their shared conditions), emptied
    /// and kept for the next key: not allocated for every key of every call.
    scratch: (Vec<Ev>, Vec<u8>),
}

impl From<TooManyKeys> for PyErr {
    fn from(e: TooManyKeys) -> PyErr {
        pyo3::exceptions::PyOverflowError::new_err(e.to_string())
    }
}

impl EngineState {
    /// An event for (group, key) in the current call.
    fn add_new(&mut self, group: u32, key: Arc<str>, item: Item) -> Result<(), TooManyKeys> {
        let id = self.keys.intern(group, &key)?;
        self.add_new_at(id, item);
        Ok(())
    }

    /// An event for the key with id `id` in the current call.
    fn add_new_at(&mut self, id: Id, item: Item) {
        let slot = self.keys.val_mut(id);
        if slot.new.is_empty() {
            self.arrived.push(id);
        }
        // Room for one event first (a key gets one a call, mostly, with many keys: its `Item`
        // in one 64-byte block, one line, instead of the first push's four in 224 bytes, where
        // half of the blocks put its event's pointer in a second line): docs/native-core.md,
        // "Many keys: ... (session 23, keys23)".
        if slot.new.capacity() == 0 {
            slot.new.reserve_exact(1);
        }
        slot.new.push(item);
    }

    /// Forget the events a failed call left in the keys' slots (each call starts with it).
    fn drop_new(&mut self) {
        for id in std::mem::take(&mut self.arrived) {
            self.keys.val_mut(id).new.clear();
            self.release_if_empty(id);
        }
    }

    /// Free the key's id when nothing refers to it any more.
    fn release_if_empty(&mut self, id: Id) {
        let slot = &self.keys.slot(id).val;
        if slot.state.is_none()
            && slot.new.is_empty()
            && !self.raw.contains_key(&id)
            && !(self.track_dirty && self.dirty.contains(&id))
        {
            self.enc.remove(&id);
            self.keys.release(id);
        }
    }

    /// Drop the key's state, bytes and wake (its id is freed unless a tombstone is owed).
    fn forget(&mut self, id: Id) {
        self.put_state(id, None);
        self.take_raw(id);
        self.enc.remove(&id);
        self.keys.discard_wake(id);
        self.release_if_empty(id);
    }

    fn has_state(&self, id: Id) -> bool {
        self.keys.slot(id).val.state.is_some() || self.raw.contains_key(&id)
    }

    fn take_state(&mut self, id: Id) -> Option<Held> {
        let ks = self.keys.val_mut(id).state.take();
        self.count_decoded(0, usize::from(ks.is_some()));
        ks
    }

    fn put_state(&mut self, id: Id, ks: Option<KeyState>) {
        self.put_held(id, ks.map(Held::Live));
    }

    fn put_held(&mut self, id: Id, ks: Option<Held>) {
        let now = usize::from(ks.is_some());
        let was = std::mem::replace(&mut self.keys.val_mut(id).state, ks);
        self.count_decoded(now, usize::from(was.is_some()));
    }

    /// `decoded` counts the slots holding a state (set only through take_state/put_state): a
    /// count that would go below zero is a broken invariant, not a wrapped len() (release too).
    fn count_decoded(&mut self, now: usize, was: usize) {
        self.decoded = (self.decoded + now)
            .checked_sub(was)
            .expect("EngineState: `decoded` counts the key slots holding a state (take_state/put_state)");
    }

    fn take_raw(&mut self, id: Id) -> Option<Vec<u8>> {
        self.raw.remove(&id)
    }

    /// Hold the key (which has no decoded state) as bytes.
    fn put_raw(&mut self, id: Id, bytes: Vec<u8>) {
        // len() counts a key once: never both decoded and held as bytes (checked in release too:
        // one slot read beside the map insert).
        assert!(self.keys.slot(id).val.state.is_none(), "EngineState: a key is never both decoded and held as bytes");
        // Nor keeps the spare room of its event vector (`advance_key` hands it back).
        let slot = self.keys.val_mut(id);
        if slot.new.is_empty() {
            slot.new = Vec::new();
        }
        self.raw.insert(id, bytes);
    }

    /// Tie the state to the engine `ident` on first use; an error if another engine (other
    /// rules, groups or families) made it.
    fn bind(&mut self, ident: u64) -> PyResult<()> {
        self.check(ident)?;
        self.engine = Some(ident);
        Ok(())
    }

    fn check(&self, ident: u64) -> PyResult<()> {
        match self.engine {
            Some(e) if e != ident => Err(PyValueError::new_err(
                "this EngineState holds the key states of an engine with other rules (rule \
                 groups, rule versions or families differ): use a new EngineState, filled with \
                 import_blob from the other engine's export_blobs",
            )),
            _ => Ok(()),
        }
    }

    /// The ids of the keys with state.
    fn with_state(&self) -> Vec<Id> {
        self.keys.ids().filter(|&id| self.has_state(id)).collect()
    }
}

#[pymethods]
impl EngineState {
    /// `track_dirty`: remember which keys each call changed (`Engine.export_blobs`), for a
    /// store that writes changed keys back (the Spark operator's). `keep_decoded`: after an
    /// export, keys stay decoded (the next call that reaches them does not decode them again,
    /// the next export does not encode them again unless they changed) while their encoded
    /// bytes total at most this many; the others are held as bytes. A decoded fraud key takes
    /// ~16x its bytes in memory. `compact_from`: from this many decoded keys on, a key's
    /// state gives back its vectors' spare room each time it is put back (0: always; tests).
    /// `adaptive`: keep `keep_decoded` or no keys decoded, whichever the keys' returns
    /// observed so far favour (`budget.rs`; with `track_dirty`).
    #[new]
    #[pyo3(signature = (track_dirty=false, keep_decoded=0, compact_from=COMPACT_FROM, adaptive=false))]
    fn new(track_dirty: bool, keep_decoded: usize, compact_from: usize, adaptive: bool) -> Self {
        Self { track_dirty, budget: Budget::new(keep_decoded, adaptive), compact_from, ..Self::default() }
    }

    /// The decoded-keys budget the last export chose (`keep_decoded`, or 0 when adaptive).
    #[getter]
    fn decoded_budget(&self) -> usize {
        self.budget.keep()
    }

    /// Counts since the state was made: keys reached while kept decoded, keys decoded again
    /// within the budget's reach of their eviction while none were kept (of a sample, one id in
    /// 8), kept keys evicted unreached, keys evicted.
    fn budget_stats(&self) -> (u64, u64, u64, u64) {
        let [a, b, c, d] = self.budget.totals;
        (a, b, c, d)
    }

    /// The number of keys with state.
    fn __len__(&self) -> usize {
        self.decoded + self.raw.len()
    }

    /// The number of keys whose state is packed at rest (`pack.rs`; tests).
    fn packed_len(&self) -> usize {
        self.keys.ids().filter(|&id| matches!(self.keys.slot(id).val.state, Some(Held::Packed(_)))).count()
    }

    /// The number of keys in the wake index.
    fn wake_len(&self) -> usize {
        self.keys.waiting()
    }

    /// The smallest max event time at which some key has work to do.
    fn next_wake(&mut self) -> Option<i64> {
        self.keys.next_due()
    }
}

/// The groups one event came too late for: reported once, as `(rule ids, key, event index,
/// watermark)` with the key and watermark of the first such group.
#[derive(Default)]
struct LateFor<'a> {
    rules: Vec<&'a str>,
    key: Option<Arc<str>>,
    wm: i64,
}

impl<'a> LateFor<'a> {
    fn add(&mut self, key: Arc<str>, wm: i64, rule_ids: &'a [String]) {
        if self.rules.is_empty() {
            self.key = Some(key);
            self.wm = wm;
        }
        self.rules.extend(rule_ids.iter().map(String::as_str));
    }

    fn report(self, py: Python<'_>, late: &Bound<'_, PyList>, index: usize) -> PyResult<()> {
        if !self.rules.is_empty() {
            let key = self.key.as_deref().unwrap_or("");
            late.append((PyTuple::new(py, self.rules)?, key, index, self.wm))?;
        }
        Ok(())
    }
}

pub(crate) struct RuleE {
    pub(crate) core: Core,
    pub(crate) id: String,
    /// `keycodec::fingerprint(id, version)`: what names the rule's part of a key state.
    pub(crate) fp: u32,
}

#[derive(Default)]
struct Proj {
    cols: Option<Arc<Cols>>,
    idx: Option<Arc<[u32]>>,
}

impl Proj {
    /// Where each of `fields` is among `row`'s columns (`u32::MAX`: absent).
    fn idx(&mut self, fields: &[String], row: &Row) -> Arc<[u32]> {
        self.idx_cols(fields, &row.cols)
    }

    /// Where each of `fields` is among the columns `cols`.
    fn idx_cols(&mut self, fields: &[String], cols: &Arc<Cols>) -> Arc<[u32]> {
        match (&self.cols, &self.idx) {
            (Some(c), Some(i)) if Arc::ptr_eq(c, cols) => i.clone(),
            _ => {
                let idx: Arc<[u32]> =
                    fields.iter().map(|f| cols.names.iter().position(|n| n == f).map_or(u32::MAX, |i| i as u32)).collect();
                self.cols = Some(cols.clone());
                self.idx = Some(idx.clone());
                idx
            }
        }
    }
}

struct Group {
    gid: String,
    kf: String,
    kf_py: Py<PyString>,
    lateness: i64,
    rules: Vec<usize>,
    rule_ids: Vec<String>,
    /// The group's field table (every rule of the group reads fields by this table's indexes).
    fields: Vec<String>,
    /// The number of distinct local conditions of the group's rules (`Core::cids`).
    ncids: usize,
    /// The projection of the last column table seen on `fields` (rows of one batch or one
    /// JSON shape share their table: the names are compared once per table, not per event).
    proj: Proj,
}

#[pyclass(module = "cep._core", name = "Engine")]
pub struct Engine {
    rules: Vec<RuleE>,
    groups: Vec<Group>,
    by_stream: HashMap<String, Vec<u32>>,
    /// Each group's place in the order of group ids (the Python engine sorts (gid, key)).
    rank: Vec<u32>,
    /// Per rule, the change in live partial matches since `take_partials` (when tracked: the
    /// Python engine's `track_partials`, for the live job's metrics).
    partials: Option<Vec<i64>>,
    /// The declared streams' column tables: a key state names them by fingerprint.
    known: Known,
    /// Rules that differ only in constants, run together (`family.rs`), and each rule's
    /// family (`NO_FAM`: none).
    families: Vec<Family>,
    fam_of: Vec<u32>,
    /// What an `EngineState` it fills depends on (`engine_ident`): a state is tied to it.
    ident: u64,
}

/// A hash of what a key state's layout depends on: the groups in order (id, rules by
/// fingerprint), the rules' families and the declared tables (a key held as bytes names a
/// table by fingerprint: an engine without it could not read the key). Engines built from the
/// same rules share it.
fn engine_ident(rules: &[RuleE], groups: &[Group], fam_of: &[u32], known: &Known) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    for g in groups {
        g.gid.hash(&mut h);
        g.rules.iter().map(|&ri| rules[ri].fp).collect::<Vec<_>>().hash(&mut h);
    }
    fam_of.hash(&mut h);
    for t in known.tables() {
        t.names.hash(&mut h);
    }
    h.finish()
}

pub(crate) const NO_FAM: u32 = u32::MAX;

#[derive(Default)]
struct Counts {
    touched: usize,
    released: usize,
    reset: usize,
}

/// A matcher state's live partial matches (`partial_count` of the matchers).
fn partials_of(m: &MState) -> i64 {
    m.runs.iter().map(|r| r.entries.len() as i64).sum()
}

fn seq_int(seq: &Bound<'_, PyAny>) -> Option<i64> {
    if seq.is_exact_instance_of::<PyInt>() {
        seq.extract::<i64>().ok()
    } else {
        None
    }
}

fn cmp_items(py: Python<'_>, a: &Item, b: &Item) -> Ordering {
    a.ts.cmp(&b.ts).then_with(|| match (a.seqi, b.seqi) {
        (Some(x), Some(y)) => x.cmp(&y),
        _ => {
            let (Ok(x), Ok(y)) = (a.seq_obj(py), b.seq_obj(py)) else { return Ordering::Equal };
            let (x, y) = (x.bind(py), y.bind(py));
            if x.lt(y).unwrap_or(false) {
                Ordering::Less
            } else if y.lt(x).unwrap_or(false) {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        }
    })
}

fn key_text(key: &Bound<'_, PyAny>) -> PyResult<Arc<str>> {
    if let Ok(s) = key.downcast::<PyString>() {
        return Ok(Arc::from(s.to_str()?));
    }
    Ok(Arc::from(key.str()?.to_str()?))
}

/// A condition's exported form with field indexes replaced by field names: equal strings
/// mean the same condition whatever the rule's field table (`Engine::new` shares them).
/// With `mask`, every constant is written as `const?` (the shape of rule families).
pub(crate) fn canon(obj: &Bound<'_, PyAny>, names: &[String], out: &mut String, mask: bool) -> PyResult<()> {
    if let Ok(l) = obj.downcast::<PyList>() {
        let tag: Option<String> = l.get_item(0).ok().and_then(|t| t.extract().ok());
        let is_field = matches!(tag.as_deref(), Some("field" | "path"));
        if mask && tag.as_deref() == Some("const") {
            out.push_str("const?");
            return Ok(());
        }
        out.push('[');
        for (k, it) in l.iter().enumerate() {
            match (k, is_field, it.extract::<usize>()) {
                (1, true, Ok(i)) if i < names.len() => {
                    out.push_str("field:");
                    out.push_str(&format!("{:?}", names[i]));
                }
                _ => canon(&it, names, out, mask)?,
            }
            out.push(',');
        }
        out.push(']');
    } else {
        out.push_str(&obj.get_type().name()?.to_string());
        out.push(':');
        out.push_str(&obj.repr()?.to_string());
    }
    Ok(())
}

/// Asks for the rows the key's rules are about to read: the released events' and the last
/// capture of each partial match. The batch wrote its rows in event order and the rules read
/// them key by key, so each first read missed the cache, one miss at a time as the tests
/// reached them (perf: the operand load of the first condition was the hottest line); asked
/// for together, the misses overlap.
fn prefetch_key(evs: &[Ev], parts: &[Option<Part>]) {
    for ev in evs {
        prefetch_ev(ev);
    }
    prefetch_parts(parts.iter().flatten());
}

/// `prefetch_key` for the last capture of each partial match of `parts`.
fn prefetch_parts<'a>(parts: impl IntoIterator<Item = &'a Part>) {
    let last_caps = parts.into_iter().flat_map(|p| &p.state.runs).filter_map(|r| r.entries.first()).filter_map(|e| e.caps.last());
    for c in last_caps.take(16) {
        prefetch_ev(&c.ev);
    }
}

/// An item's event: its `Ev` (an Arrow event's row is in it), else its `Row`.
#[inline(always)]
fn prefetch_item(it: &Item) {
    match (&it.ev, &it.row) {
        (Some(ev), _) => prefetch_ev(ev),
        (None, Some(r)) => prefetch(&**r as *const Row),
        (None, None) => {}
    }
}

/// An event's block: its count and header, then its row's values (a fraud event's 184 bytes,
/// three lines), asked for without reading the block (its length is in it).
#[inline(always)]
fn prefetch_ev(ev: &Ev) {
    let p = ev.as_ptr();
    prefetch(p);
    prefetch(p.wrapping_add(64));
    prefetch(p.wrapping_add(128));
}

/// The decoded keys `export_blobs` holds as bytes when their bytes (`enc`) are `over` past the
/// budget: the keys not changed in this call in the map's order, then the changed ones, until
/// enough. Passes that stop there (until session 17 the whole map was partitioned first, on
/// every export of a state past its budget: the live job's shards are, once their keys grow);
/// the same keys in the same order (test below).
fn to_evict(enc: &HashMap<Id, Vec<u8>>, dirty: &HashSet<Id>, mut over: usize) -> Vec<Id> {
    let mut evict = Vec::new();
    for changed in [false, true] {
        for (&id, b) in enc {
            if over == 0 {
                return evict;
            }
            if dirty.contains(&id) == changed {
                over = over.saturating_sub(b.len());
                evict.push(id);
            }
        }
    }
    evict
}

/// `Engine._advance`: add the key's new events, release what is safe, fire deadlines up to
/// `safe`, end of input, keep or release the key's state.
#[allow(clippy::too_many_arguments)]
fn advance_key(
    py: Python<'_>,
    rules: &mut [RuleE],
    fams: (&[Family], &[u32]),
    partials: Option<&mut [i64]>,
    g: &mut Group,
    st: &mut EngineState,
    (id, key): (Id, &Arc<str>),
    new: Option<Vec<Item>>,
    safe: i64,
    eof: bool,
    matches: &Bound<'_, PyList>,
    counts: &mut Counts,
) -> PyResult<()> {
    let loaded = st.take_state(id);
    if st.track_dirty {
        st.dirty.insert(id);
        if let Some(b) = st.enc.remove(&id) {
            st.budget.hit();
            st.was.entry(id).or_insert(b);
        }
    } else if !st.enc.is_empty() {
        st.enc.remove(&id);
    }
    // A packed key due by time or at the end of input whose rules report nothing and keep
    // nothing (the mass expiry of many keys): released from its words, not unpacked
    // (`Packed::ends_quietly`; docs/native-core.md, "Many keys: the packed key (session 18)").
    if let (None, None, true, Some(Held::Packed(p))) = (&new, &partials, fams.0.is_empty(), &loaded) {
        let core_of = |fp| g.rules.iter().map(|&ri| &rules[ri]).find(|r| r.fp == fp).map(|r| &r.core);
        if let Some(reset) = p.ends_quietly(core_of, (!eof).then_some(safe)) {
            counts.reset += reset;
            counts.touched += 1;
            counts.released += 1;
            drop(loaded);
            st.keys.discard_wake(id);
            st.release_if_empty(id);
            return Ok(());
        }
    }
    let (KeyState { mut buffer, parts, fams: fstates }, was_packed) = loaded.map(Held::into_live).unwrap_or_default();
    let mut fstates = fstates.into_vec();
    // The handed-in vector of new events, once emptied into a non-empty buffer, holds the events
    // released from it (its room is kept: it is handed back to the slot after the call).
    let mut spare = Vec::new();
    if let Some(mut new) = new {
        if buffer.is_empty() {
            buffer = new;
        } else {
            buffer.append(&mut new);
            spare = new;
        }
        if buffer.len() > 1 {
            // Outside the rules' guards: a panic in the sort (which leaves every event in the
            // buffer) keeps the key's state, as an error of its rules would. It panics only on
            // `seq`s that are not totally ordered: the buffer is kept in time order at least
            // (what releasing by `partition_point` below reads).
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| buffer.sort_by(|a, b| cmp_items(py, a, b)))) {
                buffer.sort_by_key(|x| x.ts);
                let e = engine_failed(&g.rule_ids.join(", "), p);
                return Err(keep_unconsumed(st, id, buffer, parts.into_iter().map(Some).collect(), fstates, e));
            }
        }
    }
    let n = buffer.partition_point(|x| x.ts <= safe);
    let released: Vec<Item> = if n == buffer.len() {
        std::mem::take(&mut buffer)
    } else {
        spare.extend(buffer.drain(..n));
        spare
    };
    let compact = st.decoded >= st.compact_from;
    // `parts` are kept in the group's rule order, so each rule's part is found at a cursor
    // (a search only after a rule change).
    let mut parts: Vec<Option<Part>> = parts.into_iter().map(Some).collect();
    let due = buffer.first().map(|x| x.ts);
    // The one error exit: whatever `run_rules` did not consume stays the key's.
    // `run_rules` outside the rules' own guards (the events' conversion, the prefetches, the
    // rule loop) is guarded here, where the key's parts and families' states live: a panic
    // there keeps them too.
    let r = catch_unwind(AssertUnwindSafe(|| {
        let ran = (&mut parts, &mut fstates);
        run_rules(py, rules, fams, partials, g, st, (id, key), (released, compact), ran, due, safe, eof, matches)
    }))
    .unwrap_or_else(|p| Err(engine_failed(&g.rule_ids.join(", "), p)));
    let (kept, kept_fams, due) = match r {
        Ok(r) => r,
        Err(e) => return Err(keep_unconsumed(st, id, buffer, parts, fstates, e)),
    };
    counts.reset += parts.iter().filter(|p| p.is_some()).count();
    counts.touched += 1;
    if buffer.is_empty() && kept.is_empty() && kept_fams.is_empty() {
        st.keys.discard_wake(id);
        st.release_if_empty(id);
        counts.released += 1;
        return Ok(());
    }
    let ks = KeyState { buffer, parts: kept, fams: kept_fams.into_boxed_slice() };
    st.put_held(id, Some(if compact { Held::pack(ks, was_packed) } else { Held::Live(ks) }));
    let when = match due {
        None => AT_END,
        Some(d) => d.saturating_add(g.lateness).saturating_add(1),
    };
    st.keys.set_wake(id, when);
    Ok(())
}

/// The error a panic caught at a rule boundary becomes, naming the rule(s) `ids`.
fn engine_failed(ids: &str, p: Box<dyn std::any::Any + Send>) -> PyErr {
    CoreError::new_err(format!("rule {ids}: the native engine failed: {}", panic_message(p)))
}

/// What `run_rules` leaves of a key: the rules' parts and the families' states to keep, and the
/// earliest deadline.
type Ran = (Vec<Part>, Vec<(u32, FState)>, Option<i64>);

/// `advance_key`'s events and rules: converts the released events and runs the group's rules
/// on them. `parts` and `fstates` are the key's, taken by the rules as they run; on an error
/// they hold what was not consumed (`keep_unconsumed`).
#[allow(clippy::too_many_arguments)]
fn run_rules(
    py: Python<'_>,
    rules: &mut [RuleE],
    fams: (&[Family], &[u32]),
    mut partials: Option<&mut [i64]>,
    g: &mut Group,
    st: &mut EngineState,
    (id, key): (Id, &Arc<str>),
    (mut released, compact): (Vec<Item>, bool),
    (parts, fstates): (&mut Vec<Option<Part>>, &mut Vec<(u32, FState)>),
    mut due: Option<i64>,
    safe: i64,
    eof: bool,
    matches: &Bound<'_, PyList>,
) -> PyResult<Ran> {
    let out = Out::lazy(matches.clone(), key);
    // One `Ev` per released event, shared by every rule of the group (one field table).
    let (mut evs, mut shared) = std::mem::take(&mut st.scratch);
    evs.reserve(released.len());
    for mut it in released.drain(..) {
        if let Some(ev) = it.ev.take() {
            evs.push(ev);
            continue;
        }
        evs.push(match (it.row.take(), &it.data, &it.seq) {
            (Some(row), _, _) => {
                let pidx = g.proj.idx(&g.fields, &row);
                Ev::from_row(*row, it.seq.as_ref().map(|x| x.clone_ref(py)), it.seqi.unwrap_or(0), it.ts, pidx)
            }
            (None, Some(d), Some(q)) => Ev::from_py(d.clone_ref(py), q.clone_ref(py), it.ts),
            _ => match it.data_obj(py).and_then(|d| Ok((d, it.seq_obj(py)?))) {
                Ok((d, q)) => Ev::from_py(d, q, it.ts),
                // As a rule's error: the key keeps its state (the released events are lost).
                Err(e) => return Err(e),
            },
        });
    }
    // The emptied vector is the key's `new` for the next call (it grew from empty every call);
    // with many keys it is dropped, as their states are compacted (`COMPACT_FROM`).
    if !compact {
        st.keys.val_mut(id).new = released;
    }
    prefetch_key(&evs, parts);
    // Per event, the group's distinct local conditions known so far (0 unknown, 1 false,
    // 2 true): a condition that several rules share is evaluated once per event.
    let ncids = g.ncids;
    shared.resize(ncids * evs.len(), 0);
    let mut kept = Vec::with_capacity(parts.len());
    let mut cursor = 0;
    let mut kept_fams = Vec::new();
    // The families' results for this key, in one list (each result tagged with its rule), made
    // when the first family runs; which families ran.
    let mut fout: Option<FOut> = None;
    let mut ran: Vec<bool> = Vec::new();
    for &ri in &g.rules {
        let fi = fams.1[ri];
        if fi != NO_FAM {
            let fi = fi as usize;
            if !ran.get(fi).is_some_and(|&r| r) {
                ran.resize(fams.0.len(), false);
                ran[fi] = true;
                let fam = &fams.0[fi];
                let fout = fout.get_or_insert_with(|| FOut::new(py, key));
                let track = partials.is_some();
                // Regrouping reads the key's bytes: inside the boundary too (a panic on corrupt
                // state becomes an error naming the rule).
                let r = catch_unwind(AssertUnwindSafe(|| {
                    let fs = family_state(fam, rules, fstates, parts, fi);
                    let before: Vec<i64> = match track {
                        true => (0..fam.members.len()).map(|i| fam.partials(fs.as_ref(), i)).collect(),
                        false => Vec::new(),
                    };
                    fam.run_key(rules, py, fs, &evs, &mut shared, ncids, safe, eof, fout).map(|fs| (before, fs))
                }));
                let (before, fs) = match r {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => return Err(e),
                    Err(p) => {
                        let e = engine_failed(&rules[fam.members[0]].id, p);
                        // The family's state and its members' parts went with the closure.
                        return Err(e);
                    }
                };
                if let Some(p) = partials.as_deref_mut() {
                    for (i, &m) in fam.members.iter().enumerate() {
                        p[m] += fam.partials(fs.as_ref(), i) - before[i];
                    }
                }
                if let Some(f) = fs {
                    if let Some(d) = f.deadline {
                        due = Some(due.map_or(d, |x| x.min(d)));
                    }
                    kept_fams.push((fi as u32, f));
                }
            }
            if let Some(fo) = &fout {
                fo.append_rule(ri, matches)?;
            }
            continue;
        }
        let rule = &mut rules[ri];
        // A part of another version of the rule has another fingerprint: it stays in `parts`
        // and is counted as reset below.
        let at = if parts.get(cursor).is_some_and(|p| p.as_ref().is_some_and(|p| p.fp == rule.fp)) {
            Some(cursor)
        } else {
            parts.iter().position(|p| p.as_ref().is_some_and(|p| p.fp == rule.fp))
        };
        let mstate = at.and_then(|i| {
            cursor = i + 1;
            parts[i].take().map(|p| p.state)
        });
        let before = match (&partials, &mstate) {
            (Some(_), Some(m)) => partials_of(m),
            _ => 0,
        };
        let core = &mut rule.core;
        let shared = &mut shared;
        let r = catch_unwind(AssertUnwindSafe(|| -> PyResult<Option<MState>> {
            let mut s = mstate;
            for (k, ev) in evs.iter().enumerate() {
                let known = &mut shared[k * ncids..(k + 1) * ncids];
                s = core.feed(py, s, ev, None, known, &out)?;
            }
            if s.as_ref().and_then(|m| m.deadline).is_some_and(|d| d <= safe) {
                if let Some(m) = s.take() {
                    s = core.advance(py, m, safe, &out)?;
                }
            }
            if eof {
                if let Some(m) = s.take() {
                    core.on_end(py, m, &out)?;
                }
            }
            Ok(s)
        }));
        let s = match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(e),
            Err(p) => {
                // The closure touched only this rule's part: the rest stays the key's.
                return Err(engine_failed(&rule.id, p));
            }
        };
        if let Some(p) = partials.as_deref_mut() {
            p[ri] += s.as_ref().map_or(0, partials_of) - before;
        }
        if let Some(m) = s {
            if let Some(d) = m.deadline {
                due = Some(due.map_or(d, |x| x.min(d)));
            }
            kept.push(Part { fp: rule.fp, state: m });
        }
    }
    evs.clear();
    shared.clear();
    st.scratch = (evs, shared);
    Ok((kept, kept_fams, due))
}

/// A rule raised (or panicked) while the key was advanced: the key keeps what the call did not
/// consume (its events not released, the parts of the rules not run yet); the released events
/// and the parts of the rules run so far are lost with the call. Every error and panic path of
/// `advance_key` (all in `run_rules`) ends here, at its one exit, as the Python engine's `_advance` does (docs/native-core.md).
fn keep_unconsumed(
    st: &mut EngineState,
    id: Id,
    buffer: Vec<Item>,
    parts: Vec<Option<Part>>,
    fams: Vec<(u32, FState)>,
    e: PyErr,
) -> PyErr {
    let parts: Vec<Part> = parts.into_iter().flatten().collect();
    if !(buffer.is_empty() && parts.is_empty() && fams.is_empty()) {
        st.put_state(id, Some(KeyState { buffer, parts, fams: fams.into_boxed_slice() }));
    }
    e
}

impl Engine {
    /// Advance every key with new events or due by `max_ts` (all keys at the end of input), in
    /// (group id, key) order.
    fn finish<'py>(
        &mut self,
        py: Python<'py>,
        st: &mut EngineState,
        max_ts: i64,
        eof: bool,
    ) -> PyResult<(Bound<'py, PyList>, Counts)> {
        // Keys are advanced in id order (their slots in memory order); results are put in
        // (group id, key) order afterwards, as the Python engine advances its keys.
        let mut due: Vec<Id> = std::mem::take(&mut st.arrived);
        if eof {
            st.keys.pop_all(&mut due);
        } else {
            st.keys.pop_due(max_ts, &mut due);
        }
        in_id_order(&mut due);
        let matches = PyList::empty(py);
        let mut counts = Counts::default();
        let mut runs: Vec<(u32, Arc<str>, usize, usize)> = Vec::new();
        for (k, &id) in due.iter().enumerate() {
            prefetch_ahead(st, &due, k);
            let start = matches.len();
            let (gi, key) = {
                let slot = st.keys.slot(id);
                (slot.group, slot.key.clone())
            };
            // Outside the rules' own guards (decoding, the key table's counts): a panic still
            // becomes an error naming the rules of the key's group.
            let r = catch_unwind(AssertUnwindSafe(|| self.finish_key(py, st, (id, gi, &key), max_ts, eof, &matches, &mut counts)))
                .unwrap_or_else(|p| {
                    let ids = self.groups[gi as usize].rule_ids.join(", ");
                    Err(engine_failed(&ids, p))
                });
            if let Err(e) = r {
                // The keys not advanced keep their state and come due again; their events of
                // this call are dropped (as `drop_new` does for a call that fails earlier).
                for &id in &due[k..] {
                    if let Some(when) = self.wake_again(st, id) {
                        st.keys.set_wake(id, when);
                    }
                }
                st.arrived = due[k..].to_vec();
                st.drop_new();
                return Err(e);
            }
            if matches.len() > start {
                runs.push((self.rank[gi as usize], key, start, matches.len()));
            }
        }
        Ok((in_key_order(py, matches, runs)?, counts))
    }

    /// Advance one due key (decoded first if it is held as bytes).
    #[allow(clippy::too_many_arguments)]
    fn finish_key(
        &mut self,
        py: Python<'_>,
        st: &mut EngineState,
        (id, gi, key): (Id, u32, &Arc<str>),
        max_ts: i64,
        eof: bool,
        matches: &Bound<'_, PyList>,
        counts: &mut Counts,
    ) -> PyResult<()> {
        if let Some(raw) = st.raw.get(&id) {
            // Decoded before it is taken: bytes that fail to decode stay the key's state.
            let ks = decode_key(py, raw, key, [&self.known, &st.imported])?;
            let raw = st.take_raw(id).unwrap_or_default();
            st.budget.decoded(id);
            st.put_state(id, Some(ks));
            if st.track_dirty {
                st.was.entry(id).or_insert(raw);
            }
        }
        let g = &mut self.groups[gi as usize];
        let safe = if eof { max_ts } else { max_ts.saturating_sub(g.lateness).saturating_sub(1) };
        let new = std::mem::take(&mut st.keys.val_mut(id).new);
        let new = (!new.is_empty()).then_some(new);
        let partials = self.partials.as_deref_mut();
        let fams = (&self.families[..], &self.fam_of[..]);
        advance_key(py, &mut self.rules, fams, partials, g, st, (id, key), new, safe, eof, matches, counts)
    }
}

/// `ingest_arrow`'s prefetch with many keys, at row `j`: row j+12's key (group `gi`, batch
/// column `c`, for each of `ahead`) hashed into `hs` and its table line asked for, row j+6's
/// slot (through that line), row j+3's text (through the slot). Out of line: with few keys the
/// row loop stays as it was (inlined there, the 1k-card run was ~2% slower).
#[inline(never)]
fn prefetch_keys(keys: &Keys<KeySlot>, b: &Batch<'_>, ahead: &[(u32, usize)], hs: &mut [[u32; 4]; 16], j: usize) {
    for (x, &(gi, c)) in ahead.iter().enumerate() {
        if let Some(t) = (j + 12 < b.len).then(|| b.bytes_at(c, j + 12)).flatten() {
            let h = keys.hash_bytes(t);
            hs[(j + 12) % 16][x] = h;
            keys.prefetch_table(gi, h);
        }
        keys.prefetch_named(gi, hs[(j + 6) % 16][x], false);
        keys.prefetch_named(gi, hs[(j + 3) % 16][x], true);
    }
}

/// `ingest_arrow`'s row `j` with many keys, pushed onto `vals`: the cells of `data_idx`, a key
/// column of one of the row's groups (`gs`) among `ahead` read as the key's own text (the
/// slot's `Arc`) when the key has an id (`found`, per group of `ahead`: the id, else
/// `NO_ID`), as a new string otherwise (the key's slot takes it). No string made and dropped
/// per event, no reference count of the batch's copy touched: the column's interning, given up
/// on a column of mostly distinct keys, made a string per cell.
fn keyed_row(
    keys: &Keys<KeySlot>,
    b: &Batch<'_>,
    j: usize,
    data_idx: &[usize],
    (ahead, gs): (&[(u32, usize)], &[u32]),
    found: &mut [Id; 4],
    vals: &mut Vec<Value>,
) -> PyResult<()> {
    *found = [NO_ID; 4];
    for &i in data_idx {
        let text = match ahead.iter().position(|&(gi, c)| c == i && gs.contains(&gi)) {
            Some(x) => b.bytes_at(i, j).map(|t| (x, t)),
            None => None,
        };
        let Some((x, t)) = text else {
            vals.push(b.get(i, j)?);
            continue;
        };
        let text = crate::arrow::utf8(t)?;
        let gi = ahead[x].0;
        vals.push(Value::Str(match keys.find(gi, text) {
            Some(id) => {
                found[x] = id;
                keys.slot(id).key.clone()
            }
            None => Arc::from(text),
        }));
    }
    Ok(())
}

/// With many keys each key's state is out of the caches: load the slots of the keys a few
/// places ahead in `due`, then what they point to (events, matcher states), in stages, so
/// that the loads overlap instead of stalling the key being advanced.
fn prefetch_ahead(st: &EngineState, due: &[Id], k: usize) {
    if let Some(&id) = due.get(k + 14) {
        st.keys.prefetch(id);
    }
    if let Some(&id) = due.get(k + 8) {
        let s = st.keys.slot(id);
        // The key's table line: a key left empty is released (e.g. every key whose deadlines
        // all pass in the call).
        st.keys.prefetch_entry(id);
        prefetch(Arc::as_ptr(&s.key).cast::<u8>());
        prefetch(s.val.new.as_ptr());
        match &s.val.state {
            Some(Held::Live(ks)) => {
                prefetch(ks.buffer.as_ptr());
                prefetch(ks.parts.as_ptr());
            }
            Some(Held::Packed(p)) => prefetch_blocks(p),
            None => {}
        }
    }
    // A packed key's events (each one block with its row's values): one stage where a live
    // key's captures are five (`parts_of` below).
    if let Some(&id) = due.get(k + 6) {
        packed_evs(st, id).for_each(prefetch_ev);
    }
    // A key's partial matches, a level per stage: runs, their entries, the first entry's
    // captures, their vector, its first event with its row's values (what `advance` reads for
    // the deadline, what a key due by time alone, with no new event, reaches first, and what
    // dropping the match reads when its deadline passes).
    if let Some(&id) = due.get(k + 7) {
        for p in parts_of(st, id) {
            prefetch(p.state.runs.as_ptr());
        }
    }
    if let Some(&id) = due.get(k + 6) {
        for r in runs_of(st, id) {
            prefetch(r.entries.as_ptr());
        }
    }
    let first_caps = |id: Id| runs_of(st, id).filter_map(|r| r.entries.first());
    if let Some(&id) = due.get(k + 5) {
        for e in first_caps(id) {
            prefetch_arc(&e.caps);
        }
    }
    if let Some(&id) = due.get(k + 4) {
        for e in first_caps(id) {
            prefetch(e.caps.v.as_ptr());
        }
    }
    if let Some(&id) = due.get(k + 3) {
        let s = st.keys.slot(id);
        for it in s.val.new.iter().take(AHEAD_EVENTS) {
            // An Arrow event's row is in its `Ev`'s block (built when the batch was read).
            prefetch_item(it);
        }
        for c in first_caps(id).filter_map(|e| e.caps.first()) {
            prefetch_ev(&c.ev);
        }
    }
}

/// The parts of the key's live state (none while it is packed or held as bytes).
fn parts_of(st: &EngineState, id: Id) -> &[Part] {
    st.keys.slot(id).val.state.as_ref().and_then(Held::live).map_or(&[], |ks| &ks.parts)
}

/// The captured events of the key's packed state (`prefetch_ahead`: a few per key).
fn packed_evs(st: &EngineState, id: Id) -> impl Iterator<Item = &Ev> {
    let evs = match &st.keys.slot(id).val.state {
        Some(Held::Packed(p)) => p.blocks().1,
        _ => &[],
    };
    evs.iter().take(AHEAD_EVENTS)
}

/// A packed key's words (the fraud card's 80 bytes span two lines) and events' slice.
#[inline(always)]
fn prefetch_blocks(p: &Packed) {
    let (w, evs) = p.blocks();
    prefetch(w);
    prefetch(w.wrapping_add(8));
    prefetch(evs.as_ptr());
}

/// The runs of the key's parts (`prefetch_ahead`: a few per key).
fn runs_of(st: &EngineState, id: Id) -> impl Iterator<Item = &crate::matcher::Run> {
    parts_of(st, id).iter().flat_map(|p| &p.state.runs).take(AHEAD_RUNS)
}

/// The runs per key whose entries and first captures `prefetch_ahead` brings in ahead.
const AHEAD_RUNS: usize = 8;

/// The events per key that `prefetch_ahead` brings in ahead.
const AHEAD_EVENTS: usize = 16;

/// The allocation of a `triomphe::Arc` (its count, which a clone writes, and the value): two
/// lines, since a block need not start on one (a 56-byte `Caps` block spans two lines in most
/// of its allocator class's slots).
#[inline(always)]
fn prefetch_arc<T>(a: &triomphe::Arc<T>) {
    let p = a.heap_ptr().cast::<u8>();
    prefetch(p);
    prefetch(p.wrapping_add(64));
}

/// `matches` with the runs of results of each key (rank of its group, key, start, end) put in
/// (group id, key) order.
fn in_key_order<'py>(
    py: Python<'py>,
    matches: Bound<'py, PyList>,
    mut runs: Vec<(u32, Arc<str>, usize, usize)>,
) -> PyResult<Bound<'py, PyList>> {
    if runs.windows(2).all(|w| (w[0].0, &w[0].1) <= (w[1].0, &w[1].1)) {
        return Ok(matches);
    }
    runs.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let out = PyList::empty(py);
    for (_, _, start, end) in runs {
        for i in start..end {
            out.append(matches.get_item(i)?)?;
        }
    }
    Ok(out)
}

/// Sort `ids` and drop repeats; many and dense (a mass expiry: ~1M ids) through a bitmap of
/// the ids, one pass each way, instead of a comparison sort (~2% of that call).
fn in_id_order(ids: &mut Vec<Id>) {
    let bound = ids.iter().max().map_or(0, |&m| m as usize + 1);
    if ids.len() < 1024 || ids.len() * 8 < bound {
        ids.sort_unstable();
        ids.dedup();
        return;
    }
    let mut bits = vec![0u64; bound.div_ceil(64)];
    for &id in ids.iter() {
        bits[id as usize / 64] |= 1 << (id % 64);
    }
    ids.clear();
    for (w, &x) in bits.iter().enumerate() {
        let mut x = x;
        while x != 0 {
            ids.push((w * 64) as Id + x.trailing_zeros());
            x &= x - 1;
        }
    }
}

type IngestOut<'py> = (Bound<'py, PyList>, Bound<'py, PyList>, usize, usize, usize);

impl Engine {
    fn gid_index(&self, gid: &str) -> PyResult<u32> {
        self.groups
            .iter()
            .position(|g| g.gid == gid)
            .map(|i| i as u32)
            .ok_or_else(|| PyValueError::new_err(format!("no rule group {gid:?} in this engine")))
    }

    /// When a key with state that a failed call did not advance is due: from its decoded
    /// state, or (held as bytes) the time it was due at.
    fn wake_again(&self, st: &EngineState, id: Id) -> Option<i64> {
        let slot = st.keys.slot(id);
        match &slot.val.state {
            Some(h) => Some(h.with_live(|ks| self.wake_of(slot.group, ks))),
            None => st.raw.contains_key(&id).then(|| st.keys.last_wake(id)),
        }
    }

    fn wake_of(&self, gi: u32, ks: &KeyState) -> i64 {
        let mut due = ks.buffer.first().map(|x| x.ts);
        for d in ks.parts.iter().map(|p| p.state.deadline).chain(ks.fams.iter().map(|f| f.1.deadline)).flatten() {
            due = Some(due.map_or(d, |x| x.min(d)));
        }
        match due {
            None => AT_END,
            Some(d) => d.saturating_add(self.groups[gi as usize].lateness).saturating_add(1),
        }
    }
}

#[pymethods]
impl Engine {
    /// `rules`: per rule `(program, max_partial_matches, stream, key_field, lateness_ms,
    /// version)`, in the rule set's order. `tables`: the declared streams' field names, in
    /// order (an event with exactly these fields is stored without them: `keycodec`).
    /// `families`: run rules that differ only in constants together (docs/rule-families.md;
    /// off for A/B runs).
    #[new]
    #[pyo3(signature = (rules, tables=Vec::new(), families=true))]
    fn new(py: Python<'_>, rules: &Bound<'_, PyList>, tables: Vec<Vec<String>>, families: bool) -> PyResult<Self> {
        let mut rs: Vec<RuleE> = Vec::new();
        let mut groups: Vec<Group> = Vec::new();
        let mut members: Vec<(String, String)> = Vec::new();
        let mut programs = Vec::new();
        let mut by_fp: HashMap<u32, usize> = HashMap::default();
        for (i, item) in rules.iter().enumerate() {
            let t = item.downcast::<PyTuple>()?;
            let program = t.get_item(0)?;
            let cap: Option<usize> = t.get_item(1)?.extract()?;
            let stream: String = t.get_item(2)?.extract()?;
            let kf: String = t.get_item(3)?.extract()?;
            let lateness: i64 = t.get_item(4)?.extract()?;
            let version: String = t.get_item(5)?.extract()?;
            let core = build_core(py, &program, cap)?;
            let id = core.p.rule_id.clone();
            let gi = match members.iter().position(|m| m.0 == stream && m.1 == kf) {
                Some(gi) => gi,
                None => {
                    members.push((stream.clone(), kf.clone()));
                    groups.push(Group {
                        gid: format!("{stream}:{kf}"),
                        kf: kf.clone(),
                        kf_py: PyString::intern(py, &kf).unbind(),
                        lateness,
                        rules: Vec::new(),
                        rule_ids: Vec::new(),
                        fields: Vec::new(),
                        ncids: 0,
                        proj: Proj::default(),
                    });
                    groups.len() - 1
                }
            };
            let g = &mut groups[gi];
            g.lateness = g.lateness.max(lateness);
            g.rules.push(i);
            g.rule_ids.push(id.clone());
            let fp = keycodec::fingerprint(&id, &version);
            // A key state names a rule's part by this 32-bit fingerprint only: two rules with
            // the same one would read each other's state.
            if let Some(&other) = by_fp.get(&fp) {
                return Err(PyValueError::new_err(format!(
                    "rules '{}' and '{id}' have the same key-state fingerprint ({fp:08x}): their \
                     state would mix; rename one of them",
                    rs[other].id
                )));
            }
            by_fp.insert(fp, rs.len());
            rs.push(RuleE { core, id, fp });
            programs.push(program);
        }
        let mut shapes = Vec::with_capacity(rs.len());
        shapes.resize_with(rs.len(), || None);
        // One field table per group (the union of its rules' tables, in order of first use):
        // every rule of a group reads the same projection of an event, so an event is projected
        // and wrapped once per group, not once per rule.
        for g in &mut groups {
            let mut names: Vec<String> = Vec::new();
            let mut py_names: Vec<Py<PyString>> = Vec::new();
            for &ri in &g.rules {
                let p = &mut rs[ri].core.p;
                let map: Vec<usize> = p
                    .fields
                    .iter()
                    .map(|f| {
                        let name = f.bind(py).to_string();
                        match names.iter().position(|n| *n == name) {
                            Some(i) => i,
                            None => {
                                names.push(name);
                                py_names.push(f.clone_ref(py));
                                names.len() - 1
                            }
                        }
                    })
                    .collect();
                for c in p.conds.iter_mut().flatten() {
                    c.remap_fields(&map);
                }
                for (_, m) in p.measures.iter_mut() {
                    m.remap_fields(&map);
                }
                for a in p.aggs.iter_mut() {
                    if let Some(r) = &mut a.row {
                        r.remap_fields(&map);
                    }
                }
            }
            // Identical local conditions (the same text over the same field names) share one
            // id: evaluated once per event for all the group's rules that hold them.
            let mut ids: HashMap<String, u32> = HashMap::default();
            for &ri in &g.rules {
                let p = &rs[ri].core.p;
                let own: Vec<String> = p.fields.iter().map(|f| f.bind(py).to_string()).collect();
                let conds = programs[ri].downcast::<PyDict>()?.get_item("conditions")?;
                let conds = conds.as_ref().and_then(|c| c.downcast::<PyList>().ok());
                let mut cids = Vec::with_capacity(p.vars.len());
                for v in 0..p.vars.len() {
                    let cid = match (p.local[v], &p.conds[v], conds) {
                        (true, Some(_), Some(cl)) => {
                            let mut text = String::new();
                            canon(&cl.get_item(v)?, &own, &mut text, false)?;
                            let n = ids.len() as u32;
                            *ids.entry(text).or_insert(n)
                        }
                        _ => NO_CID,
                    };
                    cids.push(cid);
                }
                rs[ri].core.cids = cids;
                if families {
                    shapes[ri] = family::shape(programs[ri].downcast::<PyDict>()?, &own)?;
                }
            }
            g.ncids = ids.len();
            for &ri in &g.rules {
                rs[ri].core.p.fields = py_names.iter().map(|f| f.clone_ref(py)).collect();
            }
            g.fields = names;
        }
        let mut by_stream: HashMap<String, Vec<u32>> = HashMap::default();
        for (gi, (stream, _)) in members.iter().enumerate() {
            by_stream.entry(stream.clone()).or_default().push(gi as u32);
        }
        let mut order: Vec<usize> = (0..groups.len()).collect();
        order.sort_by(|&a, &b| groups[a].gid.cmp(&groups[b].gid));
        let mut rank = vec![0u32; groups.len()];
        for (r, &gi) in order.iter().enumerate() {
            rank[gi] = r as u32;
        }
        let mut known = Known::default();
        for t in tables {
            known.add(py, t);
        }
        let group_rules: Vec<&[usize]> = groups.iter().map(|g| &g.rules[..]).collect();
        let (families, fam_of) = family::build(&rs, &group_rules, &shapes);
        let ident = engine_ident(&rs, &groups, &fam_of, &known);
        Ok(Engine { rules: rs, groups, by_stream, rank, partials: None, known, families, fam_of, ident })
    }

    /// `Engine.ingest` over a list of `cep.runtime.engine.Event`: returns (results, late as
    /// `(rule_ids, key, event index, watermark)`, keys touched, keys released, keys reset).
    #[pyo3(signature = (state, events, max_ts, end_of_input=None))]
    fn ingest<'py>(
        &mut self,
        py: Python<'py>,
        state: &Bound<'py, EngineState>,
        events: &Bound<'py, PyList>,
        max_ts: i64,
        end_of_input: Option<i64>,
    ) -> PyResult<IngestOut<'py>> {
        let mut st = state.try_borrow_mut()?;
        st.bind(self.ident)?;
        let eof = end_of_input.is_some();
        let mut max_ts = end_of_input.unwrap_or(max_ts);
        let late_wms: Vec<i64> =
            self.groups.iter().map(|g| if eof { max_ts } else { max_ts.saturating_sub(g.lateness) }).collect();
        let late = PyList::empty(py);
        st.drop_new();
        let mut top = i64::MIN;
        let (a_stream, a_ts, a_seq, a_data, a_route) = (
            intern!(py, "stream"),
            intern!(py, "ts"),
            intern!(py, "seq"),
            intern!(py, "data"),
            intern!(py, "route"),
        );
        let empty: Arc<str> = Arc::from(""); // the key of a group without PARTITION BY
        for (i, ev) in events.iter().enumerate() {
            let ts: i64 = ev.getattr(a_ts)?.extract()?;
            top = top.max(ts);
            let stream = ev.getattr(a_stream)?;
            let Some(gs) = self.by_stream.get(stream.downcast::<PyString>()?.to_str()?) else { continue };
            let data = ev.getattr(a_data)?;
            let route = ev.getattr(a_route)?;
            let route = if route.is_none() { None } else { Some(route.downcast::<PyString>()?.to_str()?.to_owned()) };
            let seq = ev.getattr(a_seq)?;
            let dict = data.downcast::<PyDict>().ok();
            let mut late_for = LateFor::default();
            for &gi in gs {
                let g = &self.groups[gi as usize];
                if route.as_ref().is_some_and(|r| *r != g.kf) {
                    continue;
                }
                let key = if g.kf.is_empty() {
                    empty.clone()
                } else {
                    let k = match dict {
                        Some(d) => d.get_item(g.kf_py.bind(py))?,
                        None => Some(data.call_method1(intern!(py, "get"), (g.kf_py.bind(py),))?),
                    };
                    match k {
                        Some(k) if !k.is_none() => key_text(&k)?,
                        _ => continue,
                    }
                };
                if ts < late_wms[gi as usize] {
                    late_for.add(key, late_wms[gi as usize], &g.rule_ids);
                    continue;
                }
                st.add_new(gi, key, Item {
                    ts,
                    seqi: seq_int(&seq),
                    seq: Some(seq.clone().unbind()),
                    data: Some(data.clone().unbind()),
                    row: None,
                    ev: None,
                })?;
            }
            late_for.report(py, &late, i)?;
        }
        if !events.is_empty() && !eof {
            max_ts = max_ts.max(top);
        }
        let (matches, counts) = self.finish(py, &mut st, max_ts, eof)?;
        Ok((matches, late, counts.touched, counts.released, counts.reset))
    }

    /// `ingest` from a pyarrow RecordBatch read through the Arrow C data interface: columns
    /// `ts` and `seq` (integers, no nulls), `stream` (strings; else every row is `stream`) and
    /// the event's fields (every other column). No Python object is made per event: a row
    /// becomes a dict only when a result or the serialised state needs it. Raises
    /// `Unsupported` for a column type the core does not read (`arrow.rs`).
    ///
    /// `json`: the name of a column holding each event as a JSON object's text (the live job's
    /// `data`); the event is that object (parsed here, `json.rs`) and the other columns are not
    /// part of it. A `route` column (strings, null for none) then says which key field a copy
    /// of the event was routed by, as `Event.route`.
    #[pyo3(signature = (state, batch, max_ts, end_of_input=None, stream=None, json=None))]
    #[allow(clippy::too_many_arguments)]
    fn ingest_arrow<'py>(
        &mut self,
        py: Python<'py>,
        state: &Bound<'py, EngineState>,
        batch: &Bound<'py, PyAny>,
        max_ts: i64,
        end_of_input: Option<i64>,
        stream: Option<String>,
        json: Option<String>,
    ) -> PyResult<IngestOut<'py>> {
        let b = read_batch(batch)?;
        let col = |name: &str| b.names.iter().position(|n| n == name);
        let (Some(ts_i), Some(seq_i)) = (col("ts"), col("seq")) else {
            return Err(PyValueError::new_err("an event batch needs the columns 'ts' and 'seq'"));
        };
        let stream_i = col("stream");
        if stream_i.is_none() && stream.is_none() {
            return Err(PyValueError::new_err("a batch without a 'stream' column needs stream="));
        }
        // Sized once (a collect into a `PyResult` grows its vector step by step).
        let ints = |i: usize, what: &str| -> PyResult<Vec<i64>> {
            let mut v = Vec::with_capacity(b.len);
            for j in 0..b.len {
                match b.get(i, j)? {
                    Value::Int(x) => v.push(x),
                    _ => {
                        let msg = format!("column '{what}': integers without nulls expected");
                        return Err(PyValueError::new_err(msg));
                    }
                }
            }
            Ok(v)
        };
        let tss = ints(ts_i, "ts")?;
        let seqs = ints(seq_i, "seq")?;
        let json_i = match &json {
            None => None,
            Some(name) => Some(col(name).ok_or_else(|| PyValueError::new_err(format!("no column '{name}' in the event batch")))?),
        };
        let route_i = if json_i.is_some() { col("route") } else { None };
        let data_idx: Vec<usize> = if json_i.is_some() {
            Vec::new()
        } else {
            (0..b.names.len()).filter(|&i| Some(i) != stream_i && i != seq_i).collect()
        };
        let mut cols_cache = ColsCache::default();
        let cols = Arc::new(Cols {
            names: data_idx.iter().map(|&i| b.names[i].clone()).collect(),
            py_names: data_idx.iter().map(|&i| PyString::intern(py, &b.names[i]).unbind()).collect(),
        });
        // Each group's key column in the batch's table (rows of a JSON column look it up by name).
        let kf_col: Vec<Option<usize>> = self.groups.iter().map(|g| cols.names.iter().position(|n| *n == g.kf)).collect();
        let mut st = state.try_borrow_mut()?;
        st.bind(self.ident)?;
        let eof = end_of_input.is_some();
        let mut max_ts = end_of_input.unwrap_or(max_ts);
        let late_wms: Vec<i64> =
            self.groups.iter().map(|g| if eof { max_ts } else { max_ts.saturating_sub(g.lateness) }).collect();
        let late = PyList::empty(py);
        st.drop_new();
        let mut top = i64::MIN;
        // Each group's projection of the batch's table (JSON rows: per row, later).
        let pidx: Vec<Option<Arc<[u32]>>> =
            self.groups.iter_mut().map(|g| json_i.is_none().then(|| g.proj.idx_cols(&g.fields, &cols))).collect();
        let mut last_gs: Option<(&[u8], Option<&[u32]>)> = None;
        // Per group, the key id of each distinct string of the key column seen in this call
        // (`Batch::last_interned`; `NO_ID`: not yet). Ids are only added during the loop (keys
        // are released in `finish`), so an id found here stays the key's.
        let mut key_ids: Vec<Vec<Id>> = vec![Vec::new(); self.groups.len()];
        let empty: Arc<str> = Arc::from(""); // the key of a group without PARTITION BY
        // With many keys, each row's key is a chain of misses when it is interned (its table
        // line, its slot, its text): they are asked for a few rows ahead, a level per stage
        // (`ahead`: the groups with a key column, at most 4; `hs`: the rows' key hashes).
        let ahead: Vec<(u32, usize)> = match json_i.is_none() && st.decoded >= st.compact_from {
            true => kf_col.iter().enumerate().filter_map(|(gi, c)| c.map(|c| (gi as u32, data_idx[c]))).take(4).collect(),
            false => Vec::new(),
        };
        let mut hs = [[0u32; 4]; 16];
        // With many keys, the ids `keyed_row` found for the row's keys (per group of `ahead`).
        let mut found = [NO_ID; 4];
        // A row's values are read into this vector, then moved into its event's block (one
        // allocation per event kept: `Ev`); the vector is reused from row to row.
        let mut buf: Vec<Value> = Vec::with_capacity(data_idx.len());
        for j in 0..b.len {
            if !ahead.is_empty() {
                prefetch_keys(&st.keys, &b, &ahead, &mut hs, j);
            }
            let ts = tss[j];
            top = top.max(ts);
            let sname: &[u8] = match stream_i {
                Some(i) => match b.bytes_at(i, j) {
                    Some(s) => s,
                    None => continue,
                },
                None => stream.as_deref().unwrap_or("").as_bytes(),
            };
            // The rows of a batch mostly share their stream: its name is checked and its groups
            // looked up again only when the bytes change.
            let gs = match last_gs {
                Some((n, gs)) if n == sname => gs,
                _ => {
                    let name = crate::arrow::utf8(sname)?;
                    let gs = self.by_stream.get(name).map(Vec::as_slice);
                    last_gs = Some((sname, gs));
                    gs
                }
            };
            let Some(gs) = gs else { continue };
            let mut row = Some(match json_i {
                Some(ji) => match b.str_at(ji, j)? {
                    Some(text) => parse_row(py, text, &mut cols_cache)?,
                    None => return Err(PyValueError::new_err(format!("row {j}: the JSON column is null"))),
                },
                None if !ahead.is_empty() => {
                    buf.clear();
                    keyed_row(&st.keys, &b, j, &data_idx, (&ahead, gs), &mut found, &mut buf)?;
                    Row { cols: cols.clone(), vals: std::mem::take(&mut buf) }
                }
                None => {
                    buf.clear();
                    for &i in &data_idx {
                        buf.push(b.get(i, j)?);
                    }
                    Row { cols: cols.clone(), vals: std::mem::take(&mut buf) }
                }
            });
            let route = match route_i {
                Some(i) => b.str_at(i, j)?,
                None => None,
            };
            let mut late_for = LateFor::default();
            for (k, &gi) in gs.iter().enumerate() {
                let g = &self.groups[gi as usize];
                if route.is_some_and(|r| r != g.kf) {
                    continue;
                }
                let Some(r) = row.as_ref() else { break };
                // The key's text, borrowed from the row when it is a string cell (no reference
                // count touched), and its id: a string cell the batch interned finds it by its
                // index among the column's distinct strings (`key_ids`), without hashing the text.
                let owned: Arc<str>;
                let got: Value;
                let mut interned = None;
                // The group's key as `keyed_row` read it: Some(its id, or `NO_ID` for a new key).
                let pre = ahead.iter().position(|a| a.0 == gi).map(|x| found[x]);
                let key: &Arc<str> = if g.kf.is_empty() {
                    &empty
                } else {
                    let kv = match (json_i, kf_col[gi as usize]) {
                        // `keyed_row` read the cell (not through the column's interning).
                        (None, Some(c)) if pre.is_some() => &r.vals[c],
                        (None, Some(c)) => {
                            interned = b.last_interned(data_idx[c]);
                            &r.vals[c]
                        }
                        (None, None) => continue,
                        (Some(_), _) => {
                            got = r.view().get(&g.kf);
                            &got
                        }
                    };
                    match kv {
                        Value::Null => continue,
                        Value::Str(s) => s,
                        Value::Int(i) => {
                            owned = Arc::from(i.to_string());
                            &owned
                        }
                        Value::Bool(x) => {
                            owned = Arc::from(if *x { "True" } else { "False" });
                            &owned
                        }
                        v => {
                            owned = key_text(v.to_py(py)?.bind(py))?;
                            &owned
                        }
                    }
                };
                if ts < late_wms[gi as usize] {
                    late_for.add(key.clone(), late_wms[gi as usize], &g.rule_ids);
                    continue;
                }
                let ids = &mut key_ids[gi as usize];
                let id = match interned.and_then(|x| ids.get(x as usize)).or(pre.as_ref()) {
                    Some(&id) if id != NO_ID => id,
                    _ => {
                        let id = st.keys.intern(gi, key)?;
                        if let Some(x) = interned.map(|x| x as usize) {
                            if ids.len() <= x {
                                ids.resize(x + 1, NO_ID);
                            }
                            ids[x] = id;
                        }
                        id
                    }
                };
                // With many keys the row names its key by the key's own text (the slot's `Arc`),
                // not the batch's copy: one string per key instead of one per event kept, and
                // dropping the event reaches the text the key's slot brings in. `keyed_row` did
                // so for the groups of `ahead` (`pre`); this swap is for a keyed group past its
                // four.
                if let (false, None, Some(c)) = (ahead.is_empty(), pre, kf_col[gi as usize]) {
                    if let Some(Value::Str(s)) = row.as_mut().map(|r| &mut r.vals[c]) {
                        let k = &st.keys.slot(id).key;
                        if !Arc::ptr_eq(s, k) {
                            *s = k.clone();
                        }
                    }
                }
                // The last group takes the row itself (its values moved, no reference count
                // touched); the others copy it.
                let last = k + 1 == gs.len();
                // The event's `Ev` is built here, while its row is in the cache, on the group's
                // projection of the batch's table (rows of a JSON column have tables of their
                // own: theirs is built when the key is advanced).
                let item = match &pidx[gi as usize] {
                    Some(p) => {
                        let ev = if last {
                            let Some(Row { cols, mut vals }) = row.take() else { break };
                            let ev = Ev::from_vals(cols, vals.drain(..), None, seqs[j], ts, p.clone());
                            buf = vals;
                            ev
                        } else {
                            let Some(r) = &row else { break };
                            Ev::from_vals(r.cols.clone(), r.vals.iter().cloned(), None, seqs[j], ts, p.clone())
                        };
                        Item { ts, seqi: Some(seqs[j]), seq: None, data: None, row: None, ev: Some(ev) }
                    }
                    None => {
                        let Some(r) = (if last { row.take() } else { row.clone() }) else { break };
                        Item { ts, seqi: Some(seqs[j]), seq: None, data: None, row: Some(Box::new(r)), ev: None }
                    }
                };
                st.add_new_at(id, item);
            }
            // A row no group took (late, no key, routed elsewhere): its vector is the next
            // row's.
            if let (None, Some(r)) = (json_i, row) {
                buf = r.vals;
            }
            late_for.report(py, &late, j)?;
        }
        if b.len > 0 && !eof {
            max_ts = max_ts.max(top);
        }
        let (matches, counts) = self.finish(py, &mut st, max_ts, eof)?;
        Ok((matches, late, counts.touched, counts.released, counts.reset))
    }


    /// The smallest max event time at which some key of `state` has work to do.
    fn next_wake(&self, state: &Bound<'_, EngineState>) -> PyResult<Option<i64>> {
        let mut st = state.try_borrow_mut()?;
        st.check(self.ident)?;
        Ok(st.keys.next_due())
    }

    /// The (group id, key) of every key with state.
    fn keys(&self, state: &Bound<'_, EngineState>) -> PyResult<Vec<(String, String)>> {
        let st = state.try_borrow()?;
        st.check(self.ident)?;
        let mut v: Vec<(String, String)> = st
            .with_state()
            .into_iter()
            .map(|id| st.keys.slot(id))
            .map(|s| (self.groups[s.group as usize].gid.clone(), s.key.to_string()))
            .collect();
        v.sort();
        Ok(v)
    }

    /// A key's state as versioned bytes (None when the key has no state): `CEPNK` format
    /// version 4 (`keycodec`).
    fn key_bytes(&self, py: Python<'_>, state: &Bound<'_, EngineState>, gid: &str, key: &str) -> PyResult<Option<Py<PyAny>>> {
        let gi = self.gid_index(gid)?;
        let st = state.try_borrow()?;
        st.check(self.ident)?;
        let Some(id) = st.keys.find(gi, key) else { return Ok(None) };
        let buf = match (&st.keys.slot(id).val.state, st.enc.get(&id).or_else(|| st.raw.get(&id))) {
            (_, Some(raw)) => raw.clone(),
            (Some(h), None) => h.with_live(|ks| encode_key(py, ks, key, [&self.known, &st.imported], &self.families, &self.rules))?,
            (None, None) => return Ok(None),
        };
        Ok(Some(PyBytes::new(py, &buf).into_any().unbind()))
    }

    /// Put a key's state read from `key_bytes` (replacing what the key had).
    fn load_key(&self, py: Python<'_>, state: &Bound<'_, EngineState>, gid: &str, key: &str, data: &[u8]) -> PyResult<()> {
        let gi = self.gid_index(gid)?;
        let mut st = state.try_borrow_mut()?;
        st.bind(self.ident)?;
        let ks = decode_key(py, data, key, [&self.known, &st.imported])?;
        let when = self.wake_of(gi, &ks);
        let id = st.keys.intern(gi, &Arc::from(key))?;
        st.take_raw(id);
        st.enc.insert(id, data.to_vec());
        st.put_state(id, Some(ks));
        st.keys.set_wake(id, when);
        Ok(())
    }

    /// Forget a key's state.
    fn delete_key(&self, state: &Bound<'_, EngineState>, gid: &str, key: &str) -> PyResult<()> {
        let gi = self.gid_index(gid)?;
        let mut st = state.try_borrow_mut()?;
        st.bind(self.ident)?;
        let Some(id) = st.keys.find(gi, key) else { return Ok(()) };
        st.forget(id);
        Ok(())
    }

    /// Apply a blob of key records (what `export_blobs` wrote): a key with bytes is held raw,
    /// decoded only when an event or a deadline reaches it; a key without (a tombstone) has no
    /// state any more. Blobs are applied in the order they were written. Returns the number of
    /// records dropped because their rule group is not in this engine (its rules were removed
    /// while the job ran).
    fn import_blob(&self, py: Python<'_>, state: &Bound<'_, EngineState>, blob: &[u8]) -> PyResult<usize> {
        let corrupt = || PyValueError::new_err("native key-state blob: truncated or corrupt bytes");
        let text = |b: &[u8]| std::str::from_utf8(b).map(str::to_owned).map_err(|_| corrupt());
        let mut st = state.try_borrow_mut()?;
        let st = &mut *st;
        let mut d = EvDec { data: blob, at: 0, var: true };
        if d.take(5)? != BLOB_MAGIC {
            return Err(PyValueError::new_err("not a native key-state blob (cep._core): wrong header"));
        }
        let version = u16::from_le_bytes(d.take(2)?.try_into().map_err(|_| corrupt())?);
        if version != BLOB_VERSION {
            return Err(PyValueError::new_err(format!(
                "native key-state blob format version {version}, but this cep._core reads version \
                 {BLOB_VERSION}: discard the state (reset the checkpoint) or replay the input"
            )));
        }
        // Tied to the engine only once the header and version are read: a refused blob leaves
        // the state as it was.
        st.bind(self.ident)?;
        let n = u32::from_le_bytes(d.take(4)?.try_into().map_err(|_| corrupt())?) as usize;
        for _ in 0..d.uv()? {
            let ncols = d.uv()? as usize;
            let mut names = Vec::with_capacity(ncols.min(1 << 12));
            for _ in 0..ncols {
                names.push(text(d.take_n()?)?);
            }
            st.imported.add(py, names);
        }
        let ngroups = d.uv()? as usize;
        let mut groups = Vec::with_capacity(ngroups.min(1 << 12));
        for _ in 0..ngroups {
            let gid = text(d.take_n()?)?;
            groups.push(self.groups.iter().position(|g| g.gid == gid));
        }
        let mut dropped = 0;
        let mut wake = 0i64;
        for _ in 0..n {
            let gi = *groups.get(d.uv()? as usize).ok_or_else(corrupt)?;
            let key: Arc<str> = Arc::from(std::str::from_utf8(d.take_n()?).map_err(|_| corrupt())?);
            wake = wake.wrapping_add(d.iv()?);
            let bytes = d.take_n()?;
            let Some(gi) = gi else {
                dropped += 1;
                continue;
            };
            let id = st.keys.intern(gi as u32, &key)?;
            st.budget.replaced(id);
            if bytes.is_empty() {
                st.forget(id);
            } else {
                st.put_state(id, None);
                st.enc.remove(&id);
                st.put_raw(id, bytes.to_vec());
                st.keys.set_wake(id, wake);
            }
        }
        Ok(dropped)
    }

    /// Blobs of key records (group id, key, wake time, `CEPNK` bytes; no bytes for a key that
    /// has no state any more) for the keys changed since the last export, each blob at most
    /// about `max_bytes`; with `all`, every key with state instead (a compaction). Keys in
    /// (group, key) order. Only keys changed since their last encoding are encoded (others
    /// reuse their bytes), and a changed key whose bytes came out as they were needs no record.
    /// Afterwards up to `keep_decoded` (`EngineState`) keys stay decoded, the others are held
    /// as bytes until needed again.
    #[pyo3(signature = (state, all=false, max_bytes=4 << 20))]
    fn export_blobs(&self, py: Python<'_>, state: &Bound<'_, EngineState>, all: bool, max_bytes: usize) -> PyResult<Vec<Py<PyAny>>> {
        let mut st = state.try_borrow_mut()?;
        let st = &mut *st;
        st.bind(self.ident)?;
        // Decoded keys without bytes: when tracked, only keys advanced since the last export.
        let decoded = |st: &EngineState, id: Id| st.keys.slot(id).val.state.is_some() && !st.enc.contains_key(&id);
        let mut fresh: Vec<Id> = if all || !st.track_dirty {
            st.keys.ids().filter(|&id| decoded(st, id)).collect()
        } else {
            st.dirty.iter().copied().filter(|&id| decoded(st, id)).collect()
        };
        // In id order (the slots' order in memory), each key's allocations asked for a few
        // keys ahead (`prefetch_encode`): encoding reads a key's slot, state, parts and rows,
        // and each was a cache miss taken one at a time (perf: loads in encode_key).
        fresh.sort_unstable();
        for (k, &id) in fresh.iter().enumerate() {
            prefetch_encode(st, &fresh, k);
            let slot = st.keys.slot(id);
            let Some(h) = &slot.val.state else { continue };
            let bytes = h.with_live(|ks| encode_key(py, ks, &slot.key, [&self.known, &st.imported], &self.families, &self.rules))?;
            st.enc.insert(id, bytes);
        }
        let was = std::mem::take(&mut st.was);
        let mut keys: Vec<Id> = if all {
            st.with_state()
        } else {
            st.dirty.iter().copied().filter(|id| was.get(id).is_none_or(|b| st.enc.get(id) != Some(b))).collect()
        };
        // Over the budget: keys not changed in this call are held as bytes first.
        st.budget.decide();
        let over = st.enc.values().map(Vec::len).sum::<usize>().saturating_sub(st.budget.keep());
        if over > 0 {
            // In id order (the slots' order in memory), each key's state asked for a few keys
            // ahead (`prefetch_ahead`, as when advancing): the keys evicted are mostly those
            // decoded in an earlier call, out of the caches, and dropping a state walks its
            // parts, runs, entries, captures and events one miss at a time (perf, session 22:
            // these drops were ~10% of the offline operator loop's samples, bench.operator_core).
            let mut evict = to_evict(&st.enc, &st.dirty, over);
            evict.sort_unstable();
            for (k, &id) in evict.iter().enumerate() {
                prefetch_ahead(st, &evict, k);
                st.put_state(id, None);
                if let Some(b) = st.enc.remove(&id) {
                    st.budget.evicted(id, b.len(), st.dirty.contains(&id));
                    st.put_raw(id, b);
                }
            }
        }
        // Keys left without state keep their ids until their tombstones are written (below).
        let written: Vec<Id> = st.dirty.drain().collect();
        let order = |id: &Id| {
            let s = st.keys.slot(*id);
            (self.rank[s.group as usize], s.key.clone())
        };
        keys.sort_by_cached_key(order);
        // Every blob of the call starts with the same header (its record count set per blob).
        let mut head: Vec<u8> = Vec::new();
        head.extend_from_slice(BLOB_MAGIC);
        head.extend_from_slice(&BLOB_VERSION.to_le_bytes());
        head.extend_from_slice(&0u32.to_le_bytes());
        let tables: Vec<&Arc<Cols>> = self.known.tables().into_iter().chain(st.imported.tables()).collect();
        put_uv(&mut head, tables.len() as u64);
        for t in tables {
            put_uv(&mut head, t.names.len() as u64);
            for n in &t.names {
                put_str(&mut head, n);
            }
        }
        put_uv(&mut head, self.groups.len() as u64);
        for g in &self.groups {
            put_str(&mut head, &g.gid);
        }
        // The records' heads first (each blob's wake deltas start from 0), so that each blob's
        // size is known and the blob is written once, straight into its bytes object: grown by
        // doubling in a vector and then copied, it was a third of the export's samples (perf,
        // bench.state_moves: ~180-300 KB a call at the live ceiling's input).
        let bytes_of = |id: Id| st.enc.get(&id).or_else(|| st.raw.get(&id)).map_or(&[][..], Vec::as_slice);
        let mut heads: Vec<u8> = Vec::new();
        let mut ends: Vec<usize> = Vec::with_capacity(keys.len()); // each record's head's end
        let mut blobs: Vec<(usize, usize)> = Vec::new(); // (records up to, bytes)
        let (mut size, mut wake) = (0, 0i64);
        for (i, &id) in keys.iter().enumerate() {
            if size == 0 {
                (size, wake) = (head.len(), 0);
            }
            let slot = st.keys.slot(id);
            let n = bytes_of(id).len();
            let w = st.keys.wake_of(id).unwrap_or(AT_END);
            let at = heads.len();
            put_uv(&mut heads, u64::from(slot.group));
            put_str(&mut heads, &slot.key);
            put_iv(&mut heads, w.wrapping_sub(wake));
            put_uv(&mut heads, n as u64);
            ends.push(heads.len());
            wake = w;
            size += heads.len() - at + n;
            if size >= max_bytes || i + 1 == keys.len() {
                blobs.push((i + 1, size));
                size = 0;
            }
        }
        let mut out = Vec::with_capacity(blobs.len());
        let mut from = 0;
        for (to, size) in blobs {
            let blob = PyBytes::new_with(py, size, |buf| {
                buf[..head.len()].copy_from_slice(&head);
                buf[7..11].copy_from_slice(&((to - from) as u32).to_le_bytes());
                let mut at = head.len();
                for i in from..to {
                    let h = &heads[if i == 0 { 0 } else { ends[i - 1] }..ends[i]];
                    for part in [h, bytes_of(keys[i])] {
                        buf[at..at + part.len()].copy_from_slice(part);
                        at += part.len();
                    }
                }
                debug_assert_eq!(at, size);
                Ok(())
            })?;
            out.push(blob.into_any().unbind());
            from = to;
        }
        for id in written {
            st.release_if_empty(id);
        }
        Ok(out)
    }

    /// The bytes of the keys' states as last encoded (held raw, or kept beside the decoded
    /// key): a measure of the shard's stored size after `export_blobs`.
    fn raw_bytes(&self, state: &Bound<'_, EngineState>) -> PyResult<usize> {
        let st = state.try_borrow()?;
        st.check(self.ident)?;
        Ok(st.raw.values().chain(st.enc.values()).map(Vec::len).sum())
    }

    /// Count per-rule changes in live partial matches (`take_partials`); off by default.
    #[getter]
    fn get_track_partials(&self) -> bool {
        self.partials.is_some()
    }

    #[setter]
    fn set_track_partials(&mut self, on: bool) {
        self.partials = if on { Some(self.partials.take().unwrap_or_else(|| vec![0; self.rules.len()])) } else { None };
    }

    /// Per rule, the change in live partial matches since the last call (non-zero ones only).
    fn take_partials(&mut self) -> Vec<(String, i64)> {
        let Some(p) = self.partials.as_mut() else { return Vec::new() };
        let out = self.rules.iter().zip(p.iter()).filter(|(_, &d)| d != 0).map(|(r, &d)| (r.id.clone(), d)).collect();
        p.iter_mut().for_each(|d| *d = 0);
        out
    }

    /// Per rule, per variable, the id of its local condition among its group's distinct
    /// conditions (None: no condition, or not local): rules with equal ids share one evaluation
    /// per event.
    fn condition_ids(&self) -> Vec<Vec<Option<u32>>> {
        self.rules.iter().map(|r| r.core.cids.iter().map(|&c| (c != NO_CID).then_some(c)).collect()).collect()
    }

    /// The rule families (docs/rule-families.md): per family, its rules' ids.
    fn families(&self) -> Vec<Vec<String>> {
        self.families.iter().map(|f| f.members.iter().map(|&ri| self.rules[ri].id.clone()).collect()).collect()
    }

    /// The group ids, in the engine's order.
    #[getter]
    fn group_ids(&self) -> Vec<String> {
        self.groups.iter().map(|g| g.gid.clone()).collect()
    }
}

/// `prefetch_ahead` for `Engine.export_blobs`' encoding of the keys `ids` (the k-th next):
/// the slot, then the state's buffer and parts, then the runs and the rows they capture.
fn prefetch_encode(st: &EngineState, ids: &[Id], k: usize) {
    if let Some(&id) = ids.get(k + 8) {
        st.keys.prefetch(id);
    }
    // A packed key (unpacked to be encoded): its blocks, then its events (each with its row's
    // values).
    if let Some(Held::Packed(p)) = ids.get(k + 4).and_then(|&id| st.keys.slot(id).val.state.as_ref()) {
        prefetch_blocks(p);
    }
    if let Some(&id) = ids.get(k + 2) {
        packed_evs(st, id).for_each(prefetch_ev);
    }
    let state = |i: usize| ids.get(k + i).and_then(|&id| st.keys.slot(id).val.state.as_ref()).and_then(Held::live);
    if let Some(ks) = state(4) {
        prefetch(ks.buffer.as_ptr());
        prefetch(ks.parts.as_ptr());
    }
    if let Some(ks) = state(2) {
        for p in &ks.parts {
            prefetch(p.state.runs.as_ptr());
        }
        for it in ks.buffer.iter().take(AHEAD_EVENTS) {
            prefetch_item(it);
        }
    }
    if let Some(ks) = state(1) {
        prefetch_parts(&ks.parts);
        // A JSON event's values (an Arrow event's came with its `Ev` above).
        for r in ks.buffer.iter().take(AHEAD_EVENTS).filter_map(|it| it.row.as_deref()) {
            prefetch(r.vals.as_ptr());
        }
    }
}

/// A key's state as `CEPNK` bytes (format version 4, `keycodec`).
fn encode_key(py: Python<'_>, ks: &KeyState, key: &str, known: [&Known; 2], fams: &[Family], rules: &[RuleE]) -> PyResult<Vec<u8>> {
    // A family's state is written as its members' own states (the format is per rule).
    let mut own = Vec::new();
    for (fi, fs) in ks.fams.iter() {
        let fam = &fams[*fi as usize];
        for (i, &ri) in fam.members.iter().enumerate() {
            own.extend(fam.project(fs, i).map(|m| (rules[ri].fp, m)));
        }
    }
    let mut enc = KeyEnc::new(key, known);
    let nparts = ks.parts.len() + own.len();
    for (fp, state) in ks.parts.iter().map(|p| (p.fp, &p.state)).chain(own.iter().map(|(fp, m)| (*fp, m))) {
        enc.part(py, fp, state)?;
    }
    let mut buffer = Vec::with_capacity(ks.buffer.len());
    for x in &ks.buffer {
        buffer.push(match (x.row(), &x.data) {
            (Some((row, id)), None) => Src::Row { row, id, seq: x.seqi.unwrap_or(0), ts: x.ts },
            _ => Src::Py { data: x.data_obj(py)?, seq: x.seq_obj(py)?, ts: x.ts },
        });
    }
    enc.finish(py, nparts, buffer)
}

/// Read `encode_key`'s bytes (format version 4; earlier versions fail with a message).
fn decode_key(py: Python<'_>, data: &[u8], key: &str, known: [&Known; 2]) -> PyResult<KeyState> {
    if data.len() < 7 || &data[..5] != KEY_MAGIC {
        return Err(PyValueError::new_err("not a native engine key state (cep._core): wrong header"));
    }
    let version = u16::from_le_bytes([data[5], data[6]]);
    if version != KEY_VERSION {
        return Err(PyValueError::new_err(format!(
            "native engine key state format version {version}, but this cep._core reads \
             version {KEY_VERSION}: the state was written by another release; discard it \
             (reset the checkpoint) or replay the input"
        )));
    }
    let dk = keycodec::decode(py, data, key, known)?;
    let parts = dk.parts.into_iter().map(|(fp, state)| Part { fp, state }).collect();
    let mut buffer = Vec::with_capacity(dk.buffer.len());
    for i in dk.buffer {
        buffer.push(match &*dk.events[i] {
            // The event's one `Ev`, shared with the parts that capture it (as when live).
            keycodec::DEv::Row(ev) => {
                Item { ts: ev.ts, seqi: Some(ev.seqi), seq: None, data: None, row: None, ev: Some(ev.clone()) }
            }
            keycodec::DEv::Py { data, seq, ts } => Item {
                ts: *ts,
                seqi: seq_int(seq.bind(py)),
                seq: Some(seq.clone_ref(py)),
                data: Some(data.clone_ref(py)),
                row: None,
                ev: None,
            },
        });
    }
    Ok(KeyState { buffer, parts, fams: Box::default() })
}

/// A family's state for a key: the one kept in memory, regrouped with its members' own parts
/// when the key was read from bytes (`Family::regroup`).
fn family_state(fam: &Family, rules: &[RuleE], fstates: &mut Vec<(u32, FState)>, parts: &mut [Option<Part>], fi: usize) -> Option<FState> {
    let fs = fstates.iter().position(|f| f.0 as usize == fi).map(|k| fstates.swap_remove(k).1);
    let mut own = Vec::new();
    for (i, &ri) in fam.members.iter().enumerate() {
        if let Some(p) = parts.iter_mut().find(|p| p.as_ref().is_some_and(|p| p.fp == rules[ri].fp)) {
            own.extend(p.take().map(|p| (i, p.state)));
        }
    }
    if own.is_empty() {
        return fs;
    }
    if let Some(f) = &fs {
        own.extend((0..fam.members.len()).filter_map(|i| fam.project(f, i).map(|m| (i, m))));
    }
    fam.regroup(own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::{Cap, CapVec, Caps};
    use crate::keys::Slot;
    use crate::matcher::{Entry, Run};
    use std::mem::size_of;

    /// What a live key costs in memory is the sum of these (docs/native-core.md, "Compact key
    /// state"): they are printed (`cargo test -- --nocapture`) and held to their sizes when
    /// measured, so that a field added to a per-key type is a decision, not a drift.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn per_key_types_stay_their_size() {
        let sizes = [
            ("Slot<KeySlot>", size_of::<Slot<KeySlot>>(), 128),
            ("KeyState", size_of::<KeyState>(), 64),
            ("Option<Held>", size_of::<Option<Held>>(), 64),
            ("Packed", size_of::<Packed>(), 32),
            ("Item", size_of::<Item>(), 56),
            ("Part", size_of::<Part>(), 56),
            ("Run", size_of::<Run>(), 48),
            ("Entry", size_of::<Entry>(), 16),
            ("CapVec", size_of::<CapVec>(), 48),
            ("Cap", size_of::<Cap>(), 24),
            // A handle (session 19): its block is the count, `EvHead`, the length and the row's
            // values (expr.rs, `an_arrow_event_is_one_block_with_its_values`).
            ("Ev", size_of::<Ev>(), 8),
            ("EvHead", size_of::<crate::expr::EvHead>(), 48),
            ("Row", size_of::<Row>(), 32),
            ("Value", size_of::<Value>(), 24),
        ];
        for (name, size, _) in sizes {
            println!("{name}: {size} B");
        }
        for (name, size, max) in sizes {
            assert!(size <= max, "{name} grew to {size} B (was {max} B): if meant, say so here and in the docs");
        }
    }

    /// `to_evict` picks what session 16's export did (the whole `enc` map partitioned into
    /// unchanged and changed keys, then taken in that order until enough): the same keys in
    /// the same order, whether the unchanged keys are enough or the changed ones are needed too.
    #[test]
    fn to_evict_picks_the_keys_the_whole_partition_picked() {
        let partitioned = |enc: &HashMap<Id, Vec<u8>>, dirty: &HashSet<Id>, mut over: usize| {
            let (old, new): (Vec<Id>, Vec<Id>) = enc.keys().partition(|id| !dirty.contains(*id));
            let mut evict = Vec::new();
            for id in old.into_iter().chain(new) {
                if over == 0 {
                    break;
                }
                over = over.saturating_sub(enc[&id].len());
                evict.push(id);
            }
            evict
        };
        let enc: HashMap<Id, Vec<u8>> = (0..300).map(|id| (id * 7, vec![0; 1 + (id as usize * 37) % 50])).collect();
        let dirty: HashSet<Id> = (0..300).filter(|id| id % 3 == 0).map(|id| id * 7).chain([1, 2]).collect();
        let total: usize = enc.values().map(Vec::len).sum();
        let unchanged: usize = enc.iter().filter(|(id, _)| !dirty.contains(*id)).map(|(_, b)| b.len()).sum();
        for over in [1, 2, 50, 51, 999, unchanged - 1, unchanged, unchanged + 1, total - 1, total, total + 9] {
            let got = to_evict(&enc, &dirty, over);
            assert_eq!(got, partitioned(&enc, &dirty, over), "over {over}");
            assert_eq!(got.iter().any(|id| dirty.contains(id)), over > unchanged, "over {over}");
        }
        assert_eq!(to_evict(&enc, &dirty, total).len(), enc.len());
        assert!(to_evict(&HashMap::default(), &dirty, 5).is_empty());
    }

    /// `KeyState::compact` gives back the spare room of the buffer, parts, runs, entries and of
    /// the captures one entry holds alone; captures two entries share keep theirs (the same
    /// `Arc`, not copied), and every position, capture and deadline is kept.
    #[test]
    fn compact_gives_back_spare_room_and_leaves_shared_captures() {
        let row = Row { cols: Arc::new(Cols { names: Vec::new(), py_names: Vec::new() }), vals: Vec::new() };
        let ev = Ev::from_row_lazy(row, 1, 10);
        let caps = |n: u32| {
            let mut v = Vec::with_capacity(8);
            v.extend((0..n).map(|var| Cap { var, row: 0, ev: ev.clone() }));
            Caps::new(CapVec::from(v))
        };
        let shared = caps(2);
        let mut entries = Vec::with_capacity(8);
        entries.push(Entry { pos: 1, caps: caps(1) });
        entries.push(Entry { pos: 2, caps: shared.clone() });
        entries.push(Entry { pos: 3, caps: shared.clone() });
        let mut runs = Vec::with_capacity(4);
        runs.push(Run { start: 10, entries, tpart: Some(caps(3)), matched: false });
        let mut parts = Vec::with_capacity(4);
        parts.push(Part { fp: 7, state: MState { row: 0, runs, deadline: Some(20) } });
        let mut ks = KeyState { buffer: Vec::with_capacity(4), parts, fams: Box::default() };
        ks.compact();
        assert_eq!((ks.buffer.capacity(), ks.parts.capacity()), (0, 1));
        let m = &ks.parts[0].state;
        assert_eq!((ks.parts[0].fp, m.deadline, m.runs.capacity()), (7, Some(20), 1));
        let r = &m.runs[0];
        assert_eq!((r.start, r.entries.capacity()), (10, 3));
        assert_eq!(r.entries.iter().map(|e| e.pos).collect::<Vec<_>>(), [1, 2, 3]);
        let alone = &r.entries[0].caps;
        assert_eq!((alone.v.len(), alone.v.capacity(), alone[0].var), (1, 1, 0));
        assert!(Ev::ptr_eq(&alone[0].ev, &ev));
        let t = r.tpart.as_ref().expect("tpart kept");
        assert_eq!((t.v.len(), t.v.capacity()), (3, 3));
        assert!(Caps::ptr_eq(&r.entries[1].caps, &shared) && Caps::ptr_eq(&r.entries[2].caps, &shared));
        assert_eq!((shared.v.len(), shared.v.capacity()), (2, 8), "shared captures left as they are");
    }
}
