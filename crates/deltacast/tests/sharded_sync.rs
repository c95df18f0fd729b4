//! The sharded trainer side end to end: N ranks (threads) each hold only their shards, sync
//! through the lockstep gather to the leader, whose frames a receiver applies. The receiver's
//! slots must equal the full tensors sliced independently, bit for bit, every step, and the
//! gather must move only the encoded changes.

mod common;

use std::thread;

use common::{mutate, Rng};
use deltacast::flush::FlushConfig;
use deltacast::placement::{local_block, DTensorLayout, MeshPlacement};
use deltacast::sharded::{Collective, RankSender, ShardedConfig};
use deltacast::slot_map::{Converter, ParamSpec, SlotMap};
use deltacast::WeightSender;
use deltacast::{CodecChoice, DType, Error, Receiver, Result};
use deltacast_net::{InProcessCollective, NetError};

struct Param {
    spec: ParamSpec,
    full: Vec<u8>,
}

/// Row-major bytes of the block of `full` a layout gives a rank.
fn local_piece(
    full: &[u8],
    shape: &[u64],
    width: usize,
    block: &deltacast::placement::Block,
) -> Vec<u8> {
    let mut out = Vec::new();
    for (start, len) in block.global_ranges() {
        out.extend_from_slice(&full[start as usize * width..(start + len) as usize * width]);
    }
    assert_eq!(out.len() as u64, block.numel() * width as u64, "{shape:?}");
    out
}

/// The slots of a parameter sliced by hand: identity → itself; qkv → row ranges.
fn expected_slots(p: &Param) -> Vec<Vec<u8>> {
    match &p.spec.converter {
        Converter::FusedQkv { sizes, .. } => {
            let row = (p.spec.shape[1] as usize) * p.spec.dtype.width();
            let mut at = 0;
            sizes
                .iter()
                .map(|&n| {
                    let s = p.full[at * row..(at + n as usize) * row].to_vec();
                    at += n as usize;
                    s
                })
                .collect()
        }
        _ => vec![p.full.clone()],
    }
}

/// A store that only lends one slot at a time (like borrowed tensors).
struct OneAtATime(Vec<Vec<u8>>);

impl deltacast::SlotStore for OneAtATime {
    fn slot(&self, id: u32) -> &[u8] {
        &self.0[id as usize]
    }

    fn slot_mut(&mut self, id: u32) -> &mut [u8] {
        &mut self.0[id as usize]
    }
}

fn run_case(
    seed: u64,
    mesh: Vec<u64>,
    placements: Vec<MeshPlacement>,
    codec: CodecChoice,
    bucket: usize,
) {
    let world: u64 = mesh.iter().product();
    let mut rng = Rng(seed);
    let mut params: Vec<Param> = Vec::new();
    for i in 0..5 {
        // Floats (ulp-coded) and one-word integer and bool dtypes (raw values).
        let dtypes = [
            DType::BF16,
            DType::F32,
            DType::F8E4M3,
            DType::I32,
            DType::U8,
            DType::Bool,
        ];
        let dtype = dtypes[rng.below(dtypes.len() as u64) as usize];
        let rows = 1 + rng.below(40);
        let cols = 1 + rng.below(9);
        let spec = if i == 2 {
            let sizes = [rows, 1 + rng.below(5), 1 + rng.below(5)];
            let total = sizes.iter().sum();
            ParamSpec::new(
                format!("l{i}.qkv"),
                vec![total, cols],
                dtype,
                Converter::FusedQkv {
                    q: format!("l{i}.q"),
                    k: format!("l{i}.k"),
                    v: format!("l{i}.v"),
                    sizes,
                },
            )
        } else {
            ParamSpec::identity(format!("l{i}.w"), vec![rows, cols], dtype)
        };
        let n = spec.shape.iter().product::<u64>() as usize * dtype.width();
        params.push(Param {
            spec,
            full: (0..n).map(|_| rng.next_u64() as u8).collect(),
        });
    }
    let map = SlotMap::new(params.iter().map(|p| p.spec.clone()).collect()).unwrap();
    let table = map.table().clone();
    let config = ShardedConfig {
        flush: FlushConfig {
            bucket_size: bucket,
            chunk_elems: 37,
            codec,
        },
        round_bytes: 300,
    };

    // Per rank: its plans (placement of every parameter).
    let mut rank_plans = Vec::new();
    for r in 0..world {
        let mut coords = Vec::new();
        let mut rest = r;
        for &m in mesh.iter().rev() {
            coords.push(rest % m);
            rest /= m;
        }
        coords.reverse();
        let plans: Vec<_> = params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let layout = DTensorLayout {
                    mesh_shape: mesh.clone(),
                    coords: coords.clone(),
                    placements: placements.clone(),
                    global_shape: p.spec.shape.clone(),
                };
                map.plan(i, &local_block(&layout).unwrap()).unwrap()
            })
            .collect();
        rank_plans.push(plans);
    }
    let mut senders: Vec<Option<RankSender>> = rank_plans
        .iter()
        .map(|plans| Some(RankSender::new(map.clone(), plans.clone(), config).unwrap()))
        .collect();
    let mut receiver = Receiver::new(table.clone());
    // The same sync into a store that lends one slot at a time (applied slot by slot).
    let zeros = table
        .slots()
        .iter()
        .map(|s| vec![0u8; s.nbytes() as usize])
        .collect();
    let mut plain = Receiver::with_state(table.clone(), OneAtATime(zeros), None).unwrap();
    // And into one that writes each flush as it arrives (back to staging where pieces of
    // different ranks interleave in a slot).
    let mut in_place = Receiver::new(table.clone());
    in_place.set_apply_as_received(true);

    for step in 0..4 {
        if step > 0 {
            for p in params.iter_mut() {
                let w = p.spec.dtype.width();
                mutate(&mut rng, &mut p.full, w, [0.0, 0.05, 0.5][step % 3]);
            }
        }
        // Each rank's local pieces.
        let pieces: Vec<Vec<Vec<u8>>> = rank_plans
            .iter()
            .map(|plans| {
                plans
                    .iter()
                    .zip(&params)
                    .map(|(plan, p)| {
                        local_piece(&p.full, &p.spec.shape, p.spec.dtype.width(), plan.block())
                    })
                    .collect()
            })
            .collect();
        let mut frames = Vec::new();
        let reports = thread::scope(|s| {
            let mut handles = Vec::new();
            let mut leader_frames = Some(&mut frames);
            for ((mut link, sender), local) in InProcessCollective::group(world as usize)
                .into_iter()
                .zip(senders.iter_mut())
                .zip(&pieces)
            {
                let mut sender = sender.take().unwrap();
                let sink_frames = if link.rank() == 0 {
                    leader_frames.take()
                } else {
                    None
                };
                handles.push(s.spawn(move || {
                    let slices: Vec<&[u8]> = local.iter().map(Vec::as_slice).collect();
                    let report = match sink_frames {
                        Some(out) => sender.sync(
                            &mut link,
                            &slices,
                            Some(|f: Vec<u8>| {
                                out.push(f);
                                Ok(())
                            }),
                        ),
                        None => sender.sync(&mut link, &slices, None::<fn(Vec<u8>) -> Result<()>>),
                    };
                    (sender, report.unwrap())
                }));
            }
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        let mut leader_report = None;
        for (slot, (sender, report)) in senders.iter_mut().zip(reports) {
            *slot = Some(sender);
            if report.sync.is_some() {
                leader_report = Some(report);
            }
        }
        let report = leader_report.unwrap();
        for f in &frames {
            assert!(f.len() <= bucket);
        }
        let mut outcome = None;
        for f in &frames {
            outcome = receiver
                .receive(f)
                .unwrap_or_else(|e| panic!("step {step}: {e}"));
            plain
                .receive(f)
                .unwrap_or_else(|e| panic!("step {step}, one slot at a time: {e}"));
            in_place
                .receive(f)
                .unwrap_or_else(|e| panic!("step {step}, in place: {e}"));
        }
        let outcome = outcome.unwrap();
        assert_eq!(outcome.state_digest, report.state_digest);
        let expected: Vec<Vec<u8>> = params.iter().flat_map(expected_slots).collect();
        assert_eq!(
            receiver.store(),
            &expected,
            "step {step}: receiver differs from the full model"
        );
        assert_eq!(plain.store().0, expected, "step {step}: one slot at a time");
        assert_eq!(in_place.store(), &expected, "step {step}: in place");
        assert_eq!(
            in_place.digests(),
            receiver.digests(),
            "step {step}: in place"
        );
        // The gather moves the encoded changes and a 64-byte manifest entry per chunk, nothing else.
        let g = &report.gather;
        assert!(g.gathered_bytes >= g.gathered_payload);
        if g.gathered_payload > 0 {
            let chunks = (g.gathered_bytes - g.gathered_payload) / 64;
            assert_eq!(g.gathered_bytes, g.gathered_payload + chunks * 64);
        }
        assert_eq!(report.sync.as_ref().unwrap().changed, g.changed);
    }
}

const AUTO: CodecChoice = CodecChoice::Auto;

#[test]
fn fsdp_worlds_one_to_five() {
    for world in 1..=5u64 {
        run_case(
            world,
            vec![world],
            vec![MeshPlacement::Shard { dim: 0 }],
            AUTO,
            4096,
        );
    }
}

#[test]
fn fsdp_by_tp_column_blocks_interleave() {
    run_case(
        11,
        vec![2, 2],
        vec![
            MeshPlacement::Shard { dim: 0 },
            MeshPlacement::Shard { dim: 1 },
        ],
        AUTO,
        2048,
    );
    run_case(
        12,
        vec![2, 3],
        vec![
            MeshPlacement::Shard { dim: 0 },
            MeshPlacement::Shard { dim: 1 },
        ],
        CodecChoice::parse("abs32+raw").unwrap(),
        1024,
    );
}

#[test]
fn hsdp_replicas_take_part_with_zero_counts() {
    run_case(
        21,
        vec![2, 3],
        vec![MeshPlacement::Replicate, MeshPlacement::Shard { dim: 0 }],
        AUTO,
        1500,
    );
}

#[test]
fn eight_byte_dtypes_are_refused_by_the_sharded_sender() {
    let map = SlotMap::new(vec![
        ParamSpec::identity("w", vec![4, 2], DType::BF16),
        ParamSpec::identity("step", vec![2], DType::I64),
    ])
    .unwrap();
    let plans = (0..map.len())
        .map(|i| {
            let layout = DTensorLayout {
                mesh_shape: vec![1],
                coords: vec![0],
                placements: vec![MeshPlacement::Shard { dim: 0 }],
                global_shape: map.param(i).unwrap().shape.clone(),
            };
            map.plan(i, &local_block(&layout).unwrap()).unwrap()
        })
        .collect();
    let config = ShardedConfig {
        flush: FlushConfig::default(),
        round_bytes: 1 << 20,
    };
    let err = RankSender::new(map, plans, config)
        .err()
        .expect("I64 is refused");
    assert_eq!(
        err.to_string(),
        "dtype I64 (parameter `step`) in a sharded sync is not supported"
    );
}

#[test]
fn a_lost_rank_fails_the_sync_with_the_transport_error() {
    let spec = ParamSpec::identity("w", vec![8, 4], DType::BF16);
    let map = SlotMap::new(vec![spec]).unwrap();
    let plan = |rank: u64| {
        let layout = DTensorLayout {
            mesh_shape: vec![2],
            coords: vec![rank],
            placements: vec![MeshPlacement::Shard { dim: 0 }],
            global_shape: vec![8, 4],
        };
        vec![map.plan(0, &local_block(&layout).unwrap()).unwrap()]
    };
    let mut sender = RankSender::new(map.clone(), plan(0), ShardedConfig::default()).unwrap();
    let mut group = InProcessCollective::group(2);
    drop(group.pop()); // rank 1 is gone before the sync
    let piece = vec![7u8; 4 * 4 * 2];
    let e = sender
        .sync(&mut group[0], &[&piece], Some(|_: Vec<u8>| Ok(())))
        .expect_err("rank 1 is gone");
    assert!(e.to_string().contains("rank 1"), "{e}");
    let Error::Transport(cause) = &e else {
        panic!("not a transport error: {e}");
    };
    assert!(
        matches!(
            cause.downcast_ref::<NetError>(),
            Some(NetError::Disconnected { peer, .. }) if peer == "rank 1"
        ),
        "{e}"
    );
    assert!(matches!(
        NetError::try_from(e),
        Ok(NetError::Disconnected { .. })
    ));
    assert_eq!(sender.version(), 0, "nothing committed");
}
