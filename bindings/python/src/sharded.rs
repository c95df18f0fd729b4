//! The sharded trainer side: torch DTensor layouts as plain data, and a
//! `RankSender` whose collectives go through a Python link object (torch.distributed, threads).

use std::collections::BTreeMap;
use std::time::Instant;

use deltacast::placement::{local_block, DTensorLayout, MeshPlacement, ShardPlacement};
use deltacast::sharded::{Collective, RankReport, ShardedConfig, SoloCollective};
use deltacast::slot_map::{ParamSpec, SlotMap};
use deltacast::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::arrays::{resolve, Want};
use crate::errors::{invalid, IntoPyResult};
use crate::params::Param;
use crate::sender::{flush_config, FrameSink, FrameType};
use crate::table::SlotTable;
use deltacast::flush::{DEFAULT_BUCKET_SIZE, DEFAULT_CHUNK_ELEMS};

/// Parses one placement: torch's `str()` forms ("S(0)", "R", "P", "_S(0, 2)"), its `repr()`
/// forms ("Shard(dim=0)", "Replicate()", "_StridedShard(dim=0, sf=2)"), or a tuple
/// ("S", 0) / ("_S", 0, 2) / ("R",).
fn parse_placement(obj: &Bound<'_, PyAny>) -> PyResult<MeshPlacement> {
    let (name, args): (String, Vec<u64>) = if let Ok(t) = obj.cast::<PyTuple>() {
        let name: String = t.get_item(0)?.extract()?;
        let mut args = Vec::new();
        for item in t.iter().skip(1) {
            args.push(item.extract::<u64>()?);
        }
        (name, args)
    } else {
        let text: String = match obj.extract::<String>() {
            Ok(s) => s,
            Err(_) => obj.str()?.to_cow()?.into_owned(),
        };
        parse_placement_text(&text)
            .ok_or_else(|| invalid(format!("cannot parse placement `{text}`")))?
    };
    let arity = |n: usize| -> PyResult<()> {
        if args.len() == n {
            Ok(())
        } else {
            Err(invalid(format!(
                "placement `{name}` takes {n} integer arguments, got {args:?}"
            )))
        }
    };
    Ok(match name.as_str() {
        "S" | "Shard" => {
            arity(1)?;
            MeshPlacement::Shard {
                dim: args[0] as usize,
            }
        }
        "_S" | "_StridedShard" | "StridedShard" => {
            arity(2)?;
            MeshPlacement::StridedShard {
                dim: args[0] as usize,
                split_factor: args[1],
            }
        }
        "R" | "Replicate" => {
            arity(0)?;
            MeshPlacement::Replicate
        }
        // Partial's argument is a reduce op name, not a number: any form is "pending sum".
        "P" | "Partial" => MeshPlacement::Partial,
        other => return Err(invalid(format!("unknown placement `{other}`"))),
    })
}

/// `Name(a, key=b)` → ("Name", [a, b]), skipping non-numeric arguments (Partial's op).
fn parse_placement_text(text: &str) -> Option<(String, Vec<u64>)> {
    let text = text.trim();
    let Some(open) = text.find('(') else {
        return Some((text.to_string(), Vec::new()));
    };
    let inner = text[open + 1..].strip_suffix(')')?;
    let name = text[..open].trim().to_string();
    let mut args = Vec::new();
    for part in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let value = part.rsplit('=').next().unwrap_or(part).trim();
        match value.parse::<u64>() {
            Ok(v) => args.push(v),
            Err(_) if name.starts_with('P') => {}
            Err(_) => return None,
        }
    }
    Some((name, args))
}

/// A DTensor's layout seen from one rank, as plain data: mesh shape, this rank's coordinate,
/// one placement per mesh dimension, and the tensor's full shape.
#[pyclass(module = "deltacast._native", frozen)]
#[derive(Clone)]
pub struct Layout {
    inner: DTensorLayout,
}

#[pymethods]
impl Layout {
    /// `coords` is `device_mesh.get_coordinate()`; None (this rank is outside the mesh) is
    /// refused, since the rank would hold no piece to place.
    #[new]
    fn new(
        mesh_shape: Vec<u64>,
        coords: Option<Vec<u64>>,
        placements: &Bound<'_, PyAny>,
        global_shape: Vec<u64>,
    ) -> PyResult<Self> {
        let Some(coords) = coords else {
            return Err(invalid(
                "this rank is not in the tensor's device mesh (get_coordinate() is None)",
            ));
        };
        let mut parsed = Vec::new();
        for p in placements.try_iter()? {
            parsed.push(parse_placement(&p?)?);
        }
        let inner = DTensorLayout {
            mesh_shape,
            coords,
            placements: parsed,
            global_shape,
        };
        // Refuse a layout deltacast cannot place now, with the torch arithmetic's message.
        local_block(&inner).py()?;
        Ok(Layout { inner })
    }

    /// The layout of a tensor every rank of a `world` holds whole: rank 0 contributes.
    #[staticmethod]
    fn replicated(world: u64, rank: u64, global_shape: Vec<u64>) -> PyResult<Self> {
        let inner = replicated(world, rank, global_shape);
        local_block(&inner).py()?;
        Ok(Layout { inner })
    }

    #[getter]
    fn mesh_shape(&self) -> Vec<u64> {
        self.inner.mesh_shape.clone()
    }

    #[getter]
    fn coords(&self) -> Vec<u64> {
        self.inner.coords.clone()
    }

    #[getter]
    fn global_shape(&self) -> Vec<u64> {
        self.inner.global_shape.clone()
    }

    /// Placements in the canonical short form ("S(0)", "_S(0, 2)", "R", "P").
    #[getter]
    fn placements(&self) -> Vec<String> {
        self.inner.placements.iter().map(placement_str).collect()
    }

    /// The shape of this rank's local tensor under torch's chunking.
    #[getter]
    fn local_shape(&self) -> PyResult<Vec<u64>> {
        Ok(local_block(&self.inner).py()?.block().shape().to_vec())
    }

    /// Where the local tensor starts in the full one, per dimension.
    #[getter]
    fn offset(&self) -> PyResult<Vec<u64>> {
        Ok(local_block(&self.inner).py()?.block().offset().to_vec())
    }

    /// The local block's contiguous runs in the flattened full tensor, `(start, len)` in
    /// order (the k-th run holds local elements `k·len ..`); empty for an empty block.
    #[getter]
    fn global_ranges(&self) -> PyResult<Vec<(u64, u64)>> {
        Ok(local_block(&self.inner)
            .py()?
            .block()
            .global_ranges()
            .collect())
    }

    /// Whether this rank holds a replica that does not contribute.
    #[getter]
    fn is_replica(&self) -> PyResult<bool> {
        Ok(matches!(
            local_block(&self.inner).py()?,
            ShardPlacement::Replica(_)
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "Layout(mesh_shape={:?}, coords={:?}, placements={:?}, global_shape={:?})",
            self.inner.mesh_shape,
            self.inner.coords,
            self.placements(),
            self.inner.global_shape
        )
    }
}

fn placement_str(p: &MeshPlacement) -> String {
    match p {
        MeshPlacement::Shard { dim } => format!("S({dim})"),
        MeshPlacement::StridedShard { dim, split_factor } => format!("_S({dim}, {split_factor})"),
        MeshPlacement::Replicate => "R".into(),
        MeshPlacement::Partial => "P".into(),
    }
}

fn replicated(world: u64, rank: u64, global_shape: Vec<u64>) -> DTensorLayout {
    DTensorLayout {
        mesh_shape: vec![world],
        coords: vec![rank],
        placements: vec![MeshPlacement::Replicate],
        global_shape,
    }
}

/// A Python object with `rank`, `world` and the three collective methods, as a gather link.
/// The core calls it without the GIL; each call takes the GIL for the Python call only.
struct PyLink {
    link: Py<PyAny>,
    rank: usize,
    world: usize,
    /// The first exception the link raised; re-raised as is after the sync unwinds.
    error: Option<PyErr>,
}

impl PyLink {
    fn call<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(Python<'_>, &Bound<'_, PyAny>) -> PyResult<T>,
    ) -> deltacast::Result<T> {
        let result = Python::attach(|py| f(py, self.link.bind(py)));
        result.map_err(|e| {
            let msg = format!("gather link `{what}` raised: {e}");
            self.error.get_or_insert(e);
            Error::IncompleteSync(msg)
        })
    }
}

/// `bytes(obj)` of a link's return value (bytes, bytearray, memoryview, uint8 array, tensor
/// `.numpy()`): one copy into a Rust buffer.
fn owned_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    let b = obj.py().get_type::<PyBytes>().call1((obj,))?;
    Ok(b.cast::<PyBytes>()?.as_bytes().to_vec())
}

impl Collective for PyLink {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_gather(&mut self, mine: &[u8]) -> deltacast::Result<Vec<Vec<u8>>> {
        self.call("all_gather", |py, link| {
            let rows = link.call_method1("all_gather", (PyBytes::new(py, mine),))?;
            let mut out = Vec::new();
            for row in rows.try_iter()? {
                out.push(owned_bytes(&row?)?);
            }
            Ok(out)
        })
    }

    fn send_to_leader(&mut self, data: &[u8]) -> deltacast::Result<()> {
        self.call("send_to_leader", |py, link| {
            link.call_method1("send_to_leader", (PyBytes::new(py, data),))
                .map(drop)
        })
    }

    fn recv_from(&mut self, rank: usize, len: usize) -> deltacast::Result<Vec<u8>> {
        let data = self.call("recv_from", |_, link| {
            owned_bytes(&link.call_method1("recv_from", (rank, len))?)
        })?;
        if data.len() != len {
            return Err(Error::Malformed(format!(
                "link returned {} bytes from rank {rank}, the plan says {len}",
                data.len()
            )));
        }
        Ok(data)
    }
}

enum Link {
    Solo(SoloCollective),
    Py(PyLink),
}

impl Collective for Link {
    fn rank(&self) -> usize {
        match self {
            Link::Solo(l) => l.rank(),
            Link::Py(l) => l.rank(),
        }
    }
    fn world(&self) -> usize {
        match self {
            Link::Solo(l) => l.world(),
            Link::Py(l) => l.world(),
        }
    }
    fn all_gather(&mut self, mine: &[u8]) -> deltacast::Result<Vec<Vec<u8>>> {
        match self {
            Link::Solo(l) => l.all_gather(mine),
            Link::Py(l) => l.all_gather(mine),
        }
    }
    fn send_to_leader(&mut self, data: &[u8]) -> deltacast::Result<()> {
        match self {
            Link::Solo(l) => l.send_to_leader(data),
            Link::Py(l) => l.send_to_leader(data),
        }
    }
    fn recv_from(&mut self, rank: usize, len: usize) -> deltacast::Result<Vec<u8>> {
        match self {
            Link::Solo(l) => l.recv_from(rank, len),
            Link::Py(l) => l.recv_from(rank, len),
        }
    }
}

/// An int attribute that may also be a method (`link.rank` or `link.rank()`).
fn int_attr(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let v = obj.getattr(name)?;
    let v = if v.is_callable() { v.call0()? } else { v };
    v.extract::<usize>()
        .map_err(|_| invalid(format!("link.{name} must be a non-negative int")))
}

/// What one sharded sync did, seen from one rank. Frames and wire figures are the leader's.
#[pyclass(module = "deltacast._native", frozen, get_all)]
pub struct RankSyncResult {
    pub kind: &'static str,
    pub version: u64,
    pub rank: usize,
    pub is_leader: bool,
    /// Changed elements in this rank's shards.
    pub local_changed: u64,
    /// Changed elements over all ranks.
    pub changed: u64,
    /// Elements of the full model.
    pub elements: u64,
    pub wire_bytes: u64,
    pub flushes: u32,
    pub chunks: u64,
    pub codecs: BTreeMap<String, u64>,
    /// The digest receivers must ack (leader only; 0 elsewhere).
    pub state_digest: u64,
    /// Bytes non-leader ranks sent to the leader.
    pub gathered_bytes: u64,
    /// Encoded bytes of this rank's own changes.
    pub payload_bytes: u64,
    /// Bytes of the all-gathered count matrices.
    pub matrix_bytes: u64,
    pub rounds: u32,
    pub sub_rounds: u32,
    /// Frames (leader, unless a sink took them; empty elsewhere).
    pub frames: Py<PyList>,
    pub seconds: f64,
    pub rust_seconds: f64,
}

#[pymethods]
impl RankSyncResult {
    #[getter]
    fn changed_ratio(&self) -> f64 {
        self.changed as f64 / self.elements.max(1) as f64
    }

    fn __repr__(&self) -> String {
        format!(
            "RankSyncResult(kind='{}', version={}, rank={}, local_changed={}, changed={}, wire_bytes={}, seconds={:.4})",
            self.kind, self.version, self.rank, self.local_changed, self.changed, self.wire_bytes, self.seconds
        )
    }
}

/// One trainer rank's sender: diffs only its own shards, converts the changes to slot
/// coordinates, and gathers them to the leader (rank 0), which emits the frames. Every rank
/// must call `sync` together (the link's collectives).
#[pyclass(module = "deltacast._native")]
pub struct RankSender {
    inner: deltacast::sharded::RankSender,
    link: Link,
    frame_type: FrameType,
    /// Per parameter: its name, dtype and this rank's local shape.
    locals: Vec<(String, deltacast::DType, Vec<u64>)>,
}

#[pymethods]
impl RankSender {
    /// `params`: every parameter, in the same order on every rank. `layouts`: per parameter
    /// (a list, or a dict by name) its `Layout`, or None for a tensor every rank holds whole;
    /// None for all means nothing is sharded. `link`: an object with `rank`, `world`,
    /// `all_gather(bytes) -> list[bytes]`, `send_to_leader(bytes)` and
    /// `recv_from(rank, nbytes) -> bytes`; None for a world of one. `round_bytes` bounds a
    /// gather round (default: the bucket size); the other options are `Sender`'s.
    #[new]
    #[pyo3(signature = (params, layouts = None, link = None, *, bucket_size = DEFAULT_BUCKET_SIZE, chunk_elems = DEFAULT_CHUNK_ELEMS, codec = "auto", round_bytes = None, frame_type = "bytes"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        params: Vec<Py<Param>>,
        layouts: Option<&Bound<'_, PyAny>>,
        link: Option<Py<PyAny>>,
        bucket_size: usize,
        chunk_elems: u64,
        codec: &str,
        round_bytes: Option<u64>,
        frame_type: &str,
    ) -> PyResult<Self> {
        let frame_type = FrameType::parse(frame_type)?;
        let flush = flush_config(bucket_size, chunk_elems, codec)?;
        let config = ShardedConfig {
            flush,
            round_bytes: round_bytes.unwrap_or(flush.bucket_size as u64),
        };
        let link = match link {
            None => Link::Solo(SoloCollective),
            Some(obj) => Python::attach(|py| -> PyResult<Link> {
                let bound = obj.bind(py);
                let rank = int_attr(bound, "rank")?;
                let world = int_attr(bound, "world")?;
                if world == 0 || rank >= world {
                    return Err(invalid(format!(
                        "link has rank {rank} in a world of {world}"
                    )));
                }
                Ok(Link::Py(PyLink {
                    link: obj.clone_ref(py),
                    rank,
                    world,
                    error: None,
                }))
            })?,
        };
        let (rank, world) = (link.rank() as u64, link.world() as u64);
        let specs: Vec<ParamSpec> = params.iter().map(|p| p.get().spec.clone()).collect();
        let layouts = layouts_arg(layouts, &specs)?;
        let map = SlotMap::new(specs.clone()).py()?;
        let mut plans = Vec::with_capacity(specs.len());
        let mut locals = Vec::with_capacity(specs.len());
        for (i, (spec, layout)) in specs.iter().zip(layouts).enumerate() {
            let layout = layout.unwrap_or_else(|| replicated(world, rank, spec.shape.clone()));
            if layout.mesh_shape.iter().product::<u64>() > world {
                return Err(invalid(format!(
                    "parameter `{}`: mesh {:?} is larger than the world of {world}",
                    spec.name, layout.mesh_shape
                )));
            }
            let plan = map.plan_layout(i, &layout).py()?;
            locals.push((spec.name.clone(), spec.dtype, plan.block().shape().to_vec()));
            plans.push(plan);
        }
        let inner = deltacast::sharded::RankSender::new(map, plans, config).py()?;
        Ok(RankSender {
            inner,
            link,
            frame_type,
            locals,
        })
    }

    /// One sync, called by every rank together with its local pieces (a dict param name →
    /// array of the local shard, or a list in parameter order). The leader gets the frames
    /// (or hands them to `sink`). Releases the GIL; the link's methods take it back to run.
    #[pyo3(signature = (local, *, sink = None))]
    fn sync(
        &mut self,
        py: Python<'_>,
        local: &Bound<'_, PyAny>,
        sink: Option<Py<PyAny>>,
    ) -> PyResult<RankSyncResult> {
        let started = Instant::now();
        let wants: Vec<Want<'_>> = self
            .locals
            .iter()
            .map(|(name, dtype, shape)| Want {
                name,
                dtype: *dtype,
                shape,
            })
            .collect();
        let (held, views) = resolve(local, &wants, false)?;
        drop(wants);
        // SAFETY: `held` keeps every array alive until this function returns, after the core
        // is done with the slices; each was checked C-contiguous with the local shape.
        let slices: Vec<&[u8]> = views.iter().map(|v| unsafe { v.bytes() }).collect();
        let leader = self.link.rank() == 0;
        let mut out = FrameSink::new(sink, self.frame_type);
        let (inner, link) = (&mut self.inner, &mut self.link);
        let (result, rust_seconds) = py.detach(|| {
            let t = Instant::now();
            let r = if leader {
                inner.sync(link, &slices, Some(|f| out.push(f)))
            } else {
                inner.sync(link, &slices, None::<fn(Vec<u8>) -> deltacast::Result<()>>)
            };
            (r, t.elapsed().as_secs_f64())
        });
        drop(held);
        if let Link::Py(l) = &mut self.link {
            if let Some(e) = l.error.take() {
                return Err(e);
            }
        }
        if let Some(e) = out.error.take() {
            return Err(e);
        }
        let report: RankReport = result.py()?;
        let stats = report.sync.unwrap_or_default();
        let frames = out.into_list(py)?.unbind();
        Ok(RankSyncResult {
            kind: report.kind.name(),
            version: report.version,
            rank: self.link.rank(),
            is_leader: leader,
            local_changed: report.local_changed,
            changed: report.gather.changed,
            elements: self.inner.map().table().total_elements(),
            wire_bytes: stats.wire_bytes,
            flushes: stats.flushes,
            chunks: stats.chunks,
            codecs: stats.codecs,
            state_digest: report.state_digest,
            gathered_bytes: report.gather.gathered_bytes,
            payload_bytes: report.gather.payload_bytes,
            matrix_bytes: report.gather.matrix_bytes,
            rounds: report.gather.rounds,
            sub_rounds: report.gather.sub_rounds,
            frames,
            seconds: started.elapsed().as_secs_f64(),
            rust_seconds,
        })
    }

    #[getter]
    fn rank(&self) -> usize {
        self.link.rank()
    }

    #[getter]
    fn world(&self) -> usize {
        self.link.world()
    }

    /// The receivers' slot table (after conversion).
    #[getter]
    fn table(&self) -> SlotTable {
        SlotTable {
            table: self.inner.map().table().clone(),
        }
    }

    /// The shape each parameter's local piece must have on this rank, by name.
    #[getter]
    fn local_shapes(&self) -> BTreeMap<String, Vec<u64>> {
        self.locals
            .iter()
            .map(|(n, _, s)| (n.clone(), s.clone()))
            .collect()
    }
}

/// Per-parameter layouts from None, a list, or a dict by name (missing names: unsharded).
fn layouts_arg(
    layouts: Option<&Bound<'_, PyAny>>,
    specs: &[ParamSpec],
) -> PyResult<Vec<Option<DTensorLayout>>> {
    let Some(obj) = layouts else {
        return Ok(vec![None; specs.len()]);
    };
    let one = |item: &Bound<'_, PyAny>| -> PyResult<Option<DTensorLayout>> {
        if item.is_none() {
            return Ok(None);
        }
        item.cast::<Layout>()
            .map(|l| Some(l.get().inner.clone()))
            .map_err(|_| invalid("a layout must be a deltacast.Layout or None"))
    };
    if let Ok(dict) = obj.cast::<pyo3::types::PyDict>() {
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            out.push(match dict.get_item(&spec.name)? {
                Some(item) => one(&item)?,
                None => None,
            });
        }
        for key in dict.keys() {
            let key: String = key.extract()?;
            if !specs.iter().any(|s| s.name == key) {
                return Err(invalid(format!("layout for unknown parameter `{key}`")));
            }
        }
        return Ok(out);
    }
    let mut out = Vec::with_capacity(specs.len());
    for item in obj.try_iter()? {
        out.push(one(&item?)?);
    }
    if out.len() != specs.len() {
        return Err(invalid(format!(
            "{} layouts for {} parameters",
            out.len(),
            specs.len()
        )));
    }
    Ok(out)
}

crate::weight_sender::weight_sender_methods!(RankSender);
