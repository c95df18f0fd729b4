//! The sharded trainer side.
//!
//! Every rank diffs only its own shards, converts the changes to the receivers' slot
//! coordinates, and encodes them. A lockstep gather then moves exactly those encoded bytes to
//! the leader (rank 0), which places them into frames without decoding or re-encoding.
//!
//! Lockstep: parameters are grouped into rounds by the size of their slots in the (identical)
//! slot table, never by a rank's own byte count, so every rank makes the same collective calls
//! in the same order. Per round, ranks all-gather a small `[rank × slot]` matrix of
//! (changed count, encoded bytes, digest contribution before and after); from it every rank
//! derives the same sub-round plan under the bucket budget, and sends exactly its bytes.

use rayon::prelude::*;

use crate::diff::{diff_and_refresh, Changes};
use crate::digest::{changes_at, element_hash, slot_salt};
use crate::dtype::load_bits;
use crate::error::{Error, Result};
use crate::flush::{encode_changes, FlushConfig, ReadyChunk, SyncEncoder, SyncStats};
use crate::plan::{plan_rounds, plan_sub_rounds};
use crate::sender::{FrameSink, WeightSender};
use crate::slot::SlotTable;
use crate::slot_map::{ParamPlan, SlotMap};
use crate::wire::{u64_at, ChunkEntry, FrameKind, SlotDigest, ENTRY_LEN};

/// How a trainer rank reaches the others: the few collective calls the lockstep gather makes,
/// over `world` ranks of which rank 0 is the leader. Implemented in one process and over TCP
/// by `deltacast-net`, by the Python bindings over any Python link, and by [`SoloCollective`].
/// Every call is collective or paired: all ranks make the same calls in the same order, which
/// the lockstep plan guarantees. A blocking call should fail, naming the peer rank, at once
/// on disconnect or after a timeout; after any error the streams may be out of step, so the
/// sync fails (and the next one is a seed) and the collective is rebuilt.
pub trait Collective {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world(&self) -> usize;
    /// Every rank contributes `mine` (small: a matrix row); every rank gets all contributions
    /// in rank order.
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// A non-leader rank sends `data` to the leader; the leader knows its length from the plan.
    fn send_to_leader(&mut self, data: &[u8]) -> Result<()>;
    /// Leader only: exactly `len` bytes from `rank` (`len` comes from the all-gathered plan;
    /// anything else is rejected before it is read).
    fn recv_from(&mut self, rank: usize, len: usize) -> Result<Vec<u8>>;
    /// Tells the peers this rank gives up (best effort), so they fail at once instead of
    /// waiting for a timeout; leaves this collective unusable. Does nothing by default.
    fn abort(&mut self, _reason: &str) {}
    /// Whether this rank is the leader.
    fn is_leader(&self) -> bool {
        self.rank() == 0
    }
}

/// The collective of a world of one rank.
#[derive(Debug, Default)]
pub struct SoloCollective;

impl Collective for SoloCollective {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
    fn send_to_leader(&mut self, _data: &[u8]) -> Result<()> {
        Err(Error::InvalidArgument(
            "a world of one has no leader to send to".into(),
        ))
    }
    fn recv_from(&mut self, rank: usize, _len: usize) -> Result<Vec<u8>> {
        Err(Error::InvalidArgument(format!(
            "a world of one has no rank {rank}"
        )))
    }
}

/// Bytes per slot in a rank's matrix row: count, encoded bytes, digest base, digest new.
const MATRIX_CELL: usize = 32;
/// Bytes of a chunk record's header in a gathered piece: a manifest entry, the one chunk
/// record of the format.
const RECORD_HEADER: usize = ENTRY_LEN;

/// How the sharded sync is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardedConfig {
    pub flush: FlushConfig,
    /// A gather round closes once its parameters' slots hold this many bytes in the full model.
    pub round_bytes: u64,
}

impl Default for ShardedConfig {
    fn default() -> Self {
        let flush = FlushConfig::default();
        ShardedConfig {
            flush,
            round_bytes: flush.bucket_size as u64,
        }
    }
}

/// What the gather moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatherStats {
    pub rounds: u32,
    pub sub_rounds: u32,
    /// Bytes sent from non-leader ranks to the leader (chunk records, nothing else).
    pub gathered_bytes: u64,
    /// Encoded position and value bytes in what the leader received (leader only).
    pub gathered_payload: u64,
    /// Encoded position and value bytes of this rank's own changes.
    pub payload_bytes: u64,
    /// Bytes of the all-gathered matrices (all rows, as every rank receives them).
    pub matrix_bytes: u64,
    /// Changed elements over all ranks.
    pub changed: u64,
}

/// What one sharded sync did, seen from one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankReport {
    pub kind: FrameKind,
    pub version: u64,
    /// Changed elements in this rank's shards.
    pub local_changed: u64,
    pub gather: GatherStats,
    /// The frames' statistics (leader only).
    pub sync: Option<SyncStats>,
    /// The combined state digest receivers must ack (leader only; 0 elsewhere).
    pub state_digest: u64,
}

/// One sync of a [`RankSender`]: the rank's collective, its local pieces (one buffer per
/// parameter: the block's elements, row-major) and, on the leader only, the frames' sink.
pub struct RankSync<'a> {
    pub link: &'a mut dyn Collective,
    pub local: &'a [&'a [u8]],
    pub sink: Option<FrameSink<'a>>,
}

impl WeightSender for RankSender {
    type Input<'a> = RankSync<'a>;
    type Report = RankReport;
    type Error = Error;

    fn slot_table(&self) -> &SlotTable {
        self.map.table()
    }
    fn version(&self) -> u64 {
        self.version
    }
    /// Meaningful on the leader (the others hold only their contributions).
    fn digests(&self) -> &[u64] {
        &self.digests
    }
    /// On every rank: ranks agree on seed or delta before each sync.
    fn request_seed(&mut self) {
        self.needs_seed = true;
    }
    fn sync(&mut self, input: RankSync<'_>) -> Result<RankReport> {
        RankSender::sync(self, input.link, input.local, input.sink)
    }
}

/// One trainer rank's sender: its shards' snapshot and digest contributions, no full tensor.
pub struct RankSender {
    map: SlotMap,
    plans: Vec<ParamPlan>,
    snapshots: Vec<Vec<u8>>,
    /// This rank's digest contribution per slot (sums over ranks to the slot digest).
    contrib: Vec<u64>,
    /// Leader only: the slot digests of the last complete sync.
    digests: Vec<u64>,
    version: u64,
    needs_seed: bool,
    config: ShardedConfig,
    /// Buffers kept from one delta to the next (their pages stay mapped): this rank's changes
    /// of one parameter, and the same per slot.
    scratch: Changes,
    scratch_slots: Vec<Changes>,
}

impl RankSender {
    /// `plans[i]` is this rank's placement of parameter `i` of `map`.
    pub fn new(map: SlotMap, plans: Vec<ParamPlan>, config: ShardedConfig) -> Result<Self> {
        config.flush.validate()?;
        if plans.len() != map.len() {
            return Err(Error::InvalidArgument(format!(
                "{} plans for {} parameters",
                plans.len(),
                map.len()
            )));
        }
        // Plans count in elements, the sync in words: the two differ for 8-byte dtypes (a
        // single-process Sender syncs those).
        for i in 0..map.len() {
            let param = map.param(i)?;
            if param.dtype.words_per_element() != 1 {
                // "dtype I64 (parameter `step`) in a sharded sync is not supported"
                return Err(Error::UnsupportedDType(format!(
                    "{} (parameter `{}`) in a sharded sync",
                    param.dtype, param.name
                )));
            }
        }
        let snapshots = plans
            .iter()
            .map(|p| vec![0u8; (p.block().numel() as usize) * width_of(&map, p)])
            .collect();
        let slots = map.table().len();
        Ok(RankSender {
            map,
            plans,
            snapshots,
            contrib: vec![0; slots],
            digests: vec![0; slots],
            version: 0,
            needs_seed: true,
            config,
            scratch: Changes::default(),
            scratch_slots: Vec::new(),
        })
    }

    pub fn map(&self) -> &SlotMap {
        &self.map
    }

    /// One sync. Every rank calls it with its local pieces (one buffer per parameter: the block's
    /// elements, row-major); the leader passes the sink its frames go to. A seed is sent the
    /// first time, after any failure, or when any rank asks for one.
    pub fn sync<L: Collective + ?Sized, F: FnMut(Vec<u8>) -> Result<()>>(
        &mut self,
        link: &mut L,
        local: &[&[u8]],
        sink: Option<F>,
    ) -> Result<RankReport> {
        if local.len() != self.plans.len() {
            return Err(Error::InvalidArgument(format!(
                "{} local buffers for {} parameters",
                local.len(),
                self.plans.len()
            )));
        }
        for (i, (plan, buf)) in self.plans.iter().zip(local).enumerate() {
            let need = plan.block().numel() as usize * width_of(&self.map, plan);
            if buf.len() != need {
                let name = self
                    .map
                    .param(i)
                    .map(|p| p.name.clone())
                    .unwrap_or_default();
                return Err(Error::SlotMismatch {
                    slot: name,
                    reason: format!(
                        "local piece has {} bytes, the placement needs {need}",
                        buf.len()
                    ),
                });
            }
        }
        let leader = link.rank() == 0;
        if leader != sink.is_some() {
            return Err(Error::InvalidArgument(
                "exactly the leader (rank 0) passes a sink".into(),
            ));
        }
        let result = self.sync_inner(link, local, sink);
        if result.is_err() {
            self.needs_seed = true;
        }
        result
    }

    fn sync_inner<L: Collective + ?Sized, F: FnMut(Vec<u8>) -> Result<()>>(
        &mut self,
        link: &mut L,
        local: &[&[u8]],
        sink: Option<F>,
    ) -> Result<RankReport> {
        let world = link.world();
        // Agree on seed or delta and on the version before touching any snapshot.
        let mut hello = vec![u8::from(self.needs_seed)];
        hello.extend_from_slice(&self.version.to_le_bytes());
        let hellos = link.all_gather(&hello)?;
        check_rows(&hellos, world, 9, "sync agreement")?;
        let seed = hellos.iter().any(|h| h[0] != 0);
        if hellos.iter().any(|h| h[1..9] != hello[1..9]) {
            return Err(Error::InvalidArgument(
                "trainer ranks disagree on the version: restart them together".into(),
            ));
        }
        let kind = if seed {
            FrameKind::Seed
        } else {
            FrameKind::Delta
        };
        let version = self.version + 1;
        let table = self.map.table().clone();
        let mut encoder = match sink {
            Some(sink) => Some(SyncEncoder::new(
                kind,
                version,
                table.hash(),
                self.config.flush,
                sink,
            )?),
            None => None,
        };
        let mut stats = GatherStats::default();
        let mut records: Vec<SlotDigest> = (0..table.len() as u32)
            .map(|slot| SlotDigest {
                slot,
                base: 0,
                new: 0,
            })
            .collect();
        let mut new_contrib = self.contrib.clone();
        let mut local_changed = 0u64;

        for params in self.rounds() {
            stats.rounds += 1;
            let first_slot = self.plans[params.start].slot_ids().start;
            let end_slot = self.plans[params.end - 1].slot_ids().end;
            // This rank's encoded chunks per slot of the round.
            let mut pieces: Vec<Vec<ReadyChunk>> =
                vec![Vec::new(); (end_slot - first_slot) as usize];
            let mut row = vec![0u8; pieces.len() * MATRIX_CELL];
            for p in params.clone() {
                self.changes_of(p, local[p], seed)?;
                let per_slot = std::mem::take(&mut self.scratch_slots);
                let plan = &self.plans[p];
                for (k, changes) in per_slot.iter().enumerate() {
                    let slot = plan.slot_ids().start + k as u32;
                    let info = table.get(slot)?;
                    let width = info.dtype.width();
                    let salt = slot_salt(slot);
                    let base = self.contrib[slot as usize];
                    let new = if seed {
                        changes
                            .positions
                            .par_iter()
                            .enumerate()
                            .with_min_len(1 << 14)
                            .map(|(j, &i)| {
                                element_hash(salt, i, load_bits(&changes.new_values, width, j))
                            })
                            .reduce(|| 0, u64::wrapping_add)
                    } else {
                        // In pieces of 2^16 changes (the hash loop is vectorized per piece).
                        const PIECE: usize = 1 << 16;
                        base.wrapping_add(
                            changes
                                .positions
                                .par_chunks(PIECE)
                                .zip(changes.old_values.par_chunks(PIECE * width))
                                .zip(changes.new_values.par_chunks(PIECE * width))
                                .map(|((pos, old), new)| changes_at(slot, width, pos, old, new))
                                .reduce(|| 0, u64::wrapping_add),
                        )
                    };
                    new_contrib[slot as usize] = new;
                    let out = &mut pieces[(slot - first_slot) as usize];
                    encode_changes(
                        &self.config.flush,
                        seed,
                        slot,
                        info.numel(),
                        info.dtype,
                        &changes.positions,
                        &changes.old_values,
                        &changes.new_values,
                        |c| {
                            out.push(c);
                            Ok(())
                        },
                    )?;
                    let count = changes.len() as u64;
                    local_changed += count;
                    let bytes: u64 = out
                        .iter()
                        .map(|c| (RECORD_HEADER + c.positions.len() + c.values.len()) as u64)
                        .sum();
                    let cell =
                        &mut row[(slot - first_slot) as usize * MATRIX_CELL..][..MATRIX_CELL];
                    cell[0..8].copy_from_slice(&count.to_le_bytes());
                    cell[8..16].copy_from_slice(&bytes.to_le_bytes());
                    cell[16..24].copy_from_slice(&(if seed { 0 } else { base }).to_le_bytes());
                    cell[24..32].copy_from_slice(&new.to_le_bytes());
                }
                self.scratch_slots = per_slot;
            }
            let matrix = link.all_gather(&row)?;
            check_rows(&matrix, world, row.len(), "gather matrix")?;
            stats.matrix_bytes += (row.len() * world) as u64;
            let cell =
                |r: usize, s: usize, field: usize| u64_at(&matrix[r], s * MATRIX_CELL + field * 8);
            for s in 0..pieces.len() {
                for r in 0..world {
                    let rec = &mut records[first_slot as usize + s];
                    rec.base = rec.base.wrapping_add(cell(r, s, 2));
                    rec.new = rec.new.wrapping_add(cell(r, s, 3));
                    stats.changed += cell(r, s, 0);
                }
            }
            for r in 1..world {
                stats.gathered_bytes += (0..pieces.len()).map(|s| cell(r, s, 1)).sum::<u64>();
            }
            let own_payload: u64 = pieces
                .iter()
                .flatten()
                .map(|c| (c.positions.len() + c.values.len()) as u64)
                .sum();
            stats.payload_bytes += own_payload;

            // The same sub-round plan on every rank: (slot, rank) pieces in slot-major order,
            // packed greedily under the bucket budget.
            let plan = plan_sub_rounds(
                pieces.len(),
                world,
                self.config.flush.bucket_size as u64,
                |r, s| cell(r, s, 1),
            );
            for sub in &plan {
                stats.sub_rounds += 1;
                let me = link.rank();
                if me != 0 {
                    let mut blob = Vec::new();
                    for &(s, r) in sub {
                        if r == me {
                            for c in &pieces[s] {
                                write_record(&mut blob, c);
                            }
                        }
                    }
                    if !blob.is_empty() {
                        link.send_to_leader(&blob)?;
                    }
                    continue;
                }
                let enc = encoder
                    .as_mut()
                    .ok_or_else(|| Error::InvalidArgument("leader without a sink".into()))?;
                for r in 0..world {
                    let mine: Vec<usize> = sub
                        .iter()
                        .filter(|&&(_, rr)| rr == r)
                        .map(|&(s, _)| s)
                        .collect();
                    if r == 0 {
                        for &s in &mine {
                            for c in &pieces[s] {
                                enc.push_ready(c)?;
                            }
                        }
                        continue;
                    }
                    let len: u64 = mine.iter().map(|&s| cell(r, s, 1)).sum();
                    if len == 0 {
                        continue;
                    }
                    let len = usize::try_from(len)
                        .map_err(|_| Error::Malformed(format!("rank {r} announces {len} bytes")))?;
                    let blob = link.recv_from(r, len)?;
                    let mut at = 0;
                    let expected_slots: Vec<u32> =
                        mine.iter().map(|&s| first_slot + s as u32).collect();
                    let mut counts = vec![0u64; mine.len()];
                    while at < blob.len() {
                        let (chunk, used) = read_record(&blob[at..])?;
                        let Some(k) = expected_slots.iter().position(|&s| s == chunk.slot) else {
                            return Err(Error::Malformed(format!(
                                "rank {r} sent a chunk of slot {} outside its plan",
                                chunk.slot
                            )));
                        };
                        counts[k] += chunk.count;
                        stats.gathered_payload +=
                            (chunk.positions.len() + chunk.values.len()) as u64;
                        enc.push_ready(&chunk)?;
                        at += used;
                    }
                    for (k, &s) in mine.iter().enumerate() {
                        if counts[k] != cell(r, s, 0) {
                            return Err(Error::Malformed(format!(
                                "rank {r} sent {} changes of slot {}, its matrix row says {}",
                                counts[k],
                                first_slot as usize + s,
                                cell(r, s, 0)
                            )));
                        }
                    }
                }
            }
        }
        let sync_stats = encoder.map(|enc| enc.finish(&records));
        // Commit only if the leader's frames all went out; every rank learns it.
        let ok = sync_stats.as_ref().is_none_or(|r| r.is_ok());
        let verdicts = link.all_gather(&[u8::from(ok)])?;
        check_rows(&verdicts, world, 1, "sync verdict")?;
        let sync_stats = sync_stats.transpose()?;
        if verdicts.iter().any(|v| v[0] == 0) {
            return Err(Error::IncompleteSync(
                "the leader could not send every frame of the sync".into(),
            ));
        }
        self.contrib = new_contrib;
        self.version = version;
        self.needs_seed = false;
        if seed {
            // A seed's buffers hold whole parameters: give them back.
            self.scratch = Changes::default();
            self.scratch_slots = Vec::new();
        }
        let state_digest = if link.rank() == 0 {
            self.digests = records.iter().map(|r| r.new).collect();
            self.digests.iter().fold(0u64, |a, &d| a.wrapping_add(d))
        } else {
            0
        };
        Ok(RankReport {
            kind,
            version,
            local_changed,
            gather: stats,
            sync: sync_stats,
            state_digest,
        })
    }

    /// Parameter index ranges of the gather rounds: closed once their slots hold
    /// `round_bytes` in the full model (the same cut on every rank).
    fn rounds(&self) -> Vec<std::ops::Range<usize>> {
        let table = self.map.table();
        let sizes = self.plans.iter().map(|plan| {
            plan.slot_ids()
                .map(|s| table.slots()[s as usize].nbytes())
                .sum::<u64>()
        });
        plan_rounds(sizes, self.config.round_bytes)
    }

    /// The changes of parameter `p` per slot, refreshing the snapshot. A seed carries every
    /// element of the local piece.
    fn changes_of(&mut self, p: usize, current: &[u8], seed: bool) -> Result<()> {
        let plan = &self.plans[p];
        let width = width_of(&self.map, plan);
        let local = &mut self.scratch;
        local.clear();
        if seed {
            self.snapshots[p].copy_from_slice(current);
            if !plan.is_replica() {
                local.positions.extend(0..plan.block().numel());
                local.old_values.extend_from_slice(current);
                local.new_values.extend_from_slice(current);
            }
        } else {
            diff_and_refresh(&mut self.snapshots[p], current, width, 0, local);
        }
        plan.convert(local, &mut self.scratch_slots)
    }
}

fn width_of(map: &SlotMap, plan: &ParamPlan) -> usize {
    map.table().slots()[plan.slot_ids().start as usize]
        .dtype
        .width()
}

fn check_rows(rows: &[Vec<u8>], world: usize, len: usize, what: &str) -> Result<()> {
    if rows.len() != world {
        return Err(Error::Malformed(format!(
            "{what}: {} rows from a world of {world}",
            rows.len()
        )));
    }
    if let Some((r, row)) = rows.iter().enumerate().find(|(_, row)| row.len() != len) {
        return Err(Error::Malformed(format!(
            "{what}: rank {r} sent {} bytes, expected {len}",
            row.len()
        )));
    }
    Ok(())
}

/// A chunk record as gathered: its manifest entry ([`ChunkEntry`], 64 bytes, the section
/// offsets relative to the record: positions at 64, values right after them), then the two
/// sections.
fn write_record(out: &mut Vec<u8>, c: &ReadyChunk) {
    let entry = ChunkEntry {
        slot: c.slot,
        pos_codec: c.pos_codec,
        val_codec: c.val_codec,
        start: c.start,
        range: c.range,
        count: c.count,
        pos_offset: RECORD_HEADER as u64,
        pos_len: c.positions.len() as u64,
        val_offset: (RECORD_HEADER + c.positions.len()) as u64,
        val_len: c.values.len() as u64,
    };
    let mut record = [0u8; RECORD_HEADER];
    entry.encode_into(&mut record);
    out.extend_from_slice(&record);
    out.extend_from_slice(&c.positions);
    out.extend_from_slice(&c.values);
}

/// Reads one chunk record, checking the entry ([`ChunkEntry::decode`]), that its sections
/// follow it as [`write_record`] lays them out, and every length against what is there.
fn read_record(b: &[u8]) -> Result<(ReadyChunk, usize)> {
    let entry = ChunkEntry::decode(b).map_err(|e| match e {
        Error::Truncated {
            needed, available, ..
        } => Error::Truncated {
            what: "gathered chunk record",
            needed,
            available,
        },
        Error::Malformed(reason) => Error::Malformed(format!("gathered chunk: {reason}")),
        other => other,
    })?;
    let pos_at = RECORD_HEADER as u64;
    if entry.pos_offset != pos_at || entry.val_offset != pos_at + entry.pos_len {
        return Err(Error::Malformed(format!(
            "gathered chunk of slot {}: sections at {} and {}, expected {pos_at} and {}",
            entry.slot,
            entry.pos_offset,
            entry.val_offset,
            pos_at.saturating_add(entry.pos_len)
        )));
    }
    // No overflow: decode checked the value section's end.
    let total = entry.val_end();
    if total > b.len() as u64 {
        return Err(Error::Truncated {
            what: "gathered chunk sections",
            needed: total,
            available: b.len() as u64,
        });
    }
    let (pos_end, total) = (entry.pos_end() as usize, total as usize);
    let chunk = ReadyChunk {
        slot: entry.slot,
        start: entry.start,
        range: entry.range,
        count: entry.count,
        pos_codec: entry.pos_codec,
        val_codec: entry.val_codec,
        positions: b[RECORD_HEADER..pos_end].to_vec(),
        values: b[pos_end..total].to_vec(),
    };
    Ok((chunk, total))
}
