//! The GPU entropy codecs (gaps positions, ulp values) against the core's, bit for bit:
//! encoders and decoders, on random and edge-case chunks.
//!
//! Built without the `cuda` feature, every test is `ignored` with its reason; built with
//! it, a missing GPU fails the test (`scripts/gpu-tests.sh`).

mod kernel_cases;

use deltacast::codec::{encode_positions, PosCodec, ValCodec};
use deltacast_cuda::Gpu;
use deltacast_testkit::Rng;
use kernel_cases::*;

/// One chunk for the entropy coder: positions relative to `start`, old and new bits.
struct CodeCase {
    width: usize,
    start: u64,
    range: u32,
    rel: Vec<u32>,
    old: Vec<u8>,
    new: Vec<u8>,
}

fn put_bits(buf: &mut [u8], i: usize, width: usize, bits: u32) {
    buf[i * width..(i + 1) * width].copy_from_slice(&bits.to_le_bytes()[..width]);
}

/// `count` sorted distinct positions below `range`: iid, clustered with far jumps (escape
/// codes in otherwise dense blocks), or every element.
fn code_positions(rng: &mut Rng, count: u32, range: u32) -> Vec<u32> {
    if count == range {
        return (0..range).collect();
    }
    let mut rel: Vec<u32> = if rng.chance(0.5) && range as u64 > 4 * count as u64 {
        // Runs of near neighbours separated by long jumps.
        let mut out = Vec::with_capacity(count as usize);
        let mut p = rng.below(16.min(range as u64));
        while out.len() < count as usize && p < range as u64 {
            out.push(p as u32);
            p += if rng.chance(0.01) {
                1 + rng.below((range as u64 / 8).max(1))
            } else {
                1 + rng.below(4)
            };
        }
        out
    } else {
        let mut set = std::collections::BTreeSet::new();
        while set.len() < count as usize {
            set.insert(rng.below(range as u64) as u32);
        }
        set.into_iter().collect()
    };
    rel.dedup();
    if rel.is_empty() {
        rel.push(0);
    }
    rel
}

/// Old and new bits of `n` changes: mostly ±1 ULP, some larger steps, sign crossings, NaN,
/// ±0, subnormals, random patterns, and (`unchanged`) a few equal pairs.
fn code_values(rng: &mut Rng, n: usize, width: usize, unchanged: bool) -> (Vec<u8>, Vec<u8>) {
    use deltacast::dtype::{from_ordered, to_ordered};
    let m = mask(width);
    let mut old = vec![0u8; n * width];
    let mut new = vec![0u8; n * width];
    for i in 0..n {
        let o = if rng.chance(0.1) {
            special(rng, width)
        } else {
            rng.next_u64() as u32 & m
        };
        let ord = to_ordered(o, width);
        let step: u32 = match rng.below(100) {
            0..=79 => 1,
            80..=89 => 1 + rng.below(8) as u32,
            90..=95 => 1 + rng.below(5000) as u32,
            _ => rng.next_u64() as u32,
        };
        let mut nw = if rng.chance(0.5) {
            from_ordered(ord.wrapping_add(step) & m, width)
        } else {
            from_ordered(ord.wrapping_sub(step) & m, width)
        };
        if rng.chance(0.02) {
            nw = special(rng, width);
        }
        if nw == o && !unchanged {
            nw = from_ordered(ord.wrapping_add(1) & m, width);
        }
        if unchanged && rng.chance(0.01) {
            nw = o;
        }
        put_bits(&mut old, i, width, o);
        put_bits(&mut new, i, width, nw);
    }
    (old, new)
}

fn code_cases(rng: &mut Rng) -> Vec<CodeCase> {
    let shapes: &[(u32, u32)] = &[
        (1, 1),
        (1, 7),
        (2, 2),
        (5, 9),
        (1023, 5000),
        (1024, 1024),
        (1025, 200_000),
        (3000, 3000),
        (2049, 2100),
        (4000, 40_000_000),
        (1500, u32::MAX),
        (700, 1 << 20),
    ];
    let mut out = Vec::new();
    for width in [1usize, 2, 4] {
        for (i, &(count, range)) in shapes.iter().enumerate() {
            let rel = code_positions(rng, count, range);
            let (old, new) = code_values(rng, rel.len(), width, i % 4 == 3);
            out.push(CodeCase {
                width,
                start: rng.below(100_000),
                range,
                rel,
                old,
                new,
            });
        }
    }
    out
}

fn cpu_gaps(c: &CodeCase) -> Vec<u8> {
    let mut out = Vec::new();
    encode_positions(PosCodec::Gaps, &c.rel, c.range, &mut out);
    out
}

fn cpu_ulp(c: &CodeCase) -> Vec<u8> {
    let mut out = Vec::new();
    deltacast::codec::encode_values(ValCodec::Ulp, c.width, &c.old, &c.new, &mut out);
    out
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn entropy_encoders_match_the_core() {
    let gpu = gpu();
    let mut rng = Rng(0xe17);
    for round in 0..3 {
        let cases = code_cases(&mut rng);
        // Every case's inputs, uploaded one after the other (positions as u64 slot indices).
        let mut pos_bytes = Vec::new();
        let mut old_bytes = Vec::new();
        let mut new_bytes = Vec::new();
        let mut offsets = Vec::new();
        for c in &cases {
            offsets.push((pos_bytes.len(), old_bytes.len()));
            for &r in &c.rel {
                pos_bytes.extend_from_slice(&(c.start + r as u64).to_le_bytes());
            }
            old_bytes.extend_from_slice(&c.old);
            new_bytes.extend_from_slice(&c.new);
            while old_bytes.len() % 4 != 0 {
                old_bytes.push(0);
                new_bytes.push(0);
            }
        }
        // The coder reads DECODE_SLACK bytes past its inputs.
        let slack = deltacast_cuda::DECODE_SLACK as usize;
        for v in [&mut pos_bytes, &mut old_bytes, &mut new_bytes] {
            v.resize(v.len() + slack, 0);
        }
        let pos = gpu.upload(&pos_bytes).expect("upload");
        let old = gpu.upload(&old_bytes).expect("upload");
        let new = gpu.upload(&new_bytes).expect("upload");
        let chunks: Vec<deltacast_cuda::CodeChunk> = cases
            .iter()
            .zip(&offsets)
            .map(|(c, &(p, v))| deltacast_cuda::CodeChunk {
                positions: pos.ptr() + p as u64,
                new_bits: new.ptr() + v as u64,
                old_bits: old.ptr() + v as u64,
                count: c.rel.len() as u64,
                start: c.start + c.rel[0] as u64,
                range: c.range as u64 - c.rel[0] as u64,
                width: c.width,
            })
            .collect();
        let mut scratch = deltacast_cuda::CodeScratch::new();
        // SAFETY: the buffers hold every chunk's items.
        let sizes = unsafe { gpu.entropy_size(&mut scratch, &chunks) }.expect("size");
        // The core codes positions relative to the chunk's first change, as the sync does.
        let rebased: Vec<CodeCase> = cases
            .iter()
            .map(|c| CodeCase {
                width: c.width,
                start: c.start + c.rel[0] as u64,
                range: c.range - c.rel[0],
                rel: c.rel.iter().map(|&r| r - c.rel[0]).collect(),
                old: c.old.clone(),
                new: c.new.clone(),
            })
            .collect();
        let want_gaps: Vec<Vec<u8>> = rebased.iter().map(cpu_gaps).collect();
        let want_ulp: Vec<Vec<u8>> = rebased.iter().map(cpu_ulp).collect();
        for (i, s) in sizes.iter().enumerate() {
            assert_eq!(
                s.gaps,
                want_gaps[i].len() as u64,
                "round {round} case {i} gaps size"
            );
            assert_eq!(
                s.ulp,
                want_ulp[i].len() as u64,
                "round {round} case {i} ulp size"
            );
        }
        // Place: gaps sections packed, values alternately ulp and raw, 4-aligned each.
        let mut places = Vec::new();
        let (mut goff, mut voff) = (0u64, 0u64);
        let mut layout = Vec::new();
        for (i, s) in sizes.iter().enumerate() {
            let raw = i % 5 == 2;
            let vlen = if raw {
                (cases[i].rel.len() * cases[i].width) as u64
            } else {
                s.ulp
            };
            layout.push((goff, voff, vlen, raw));
            goff += s.gaps.next_multiple_of(4);
            voff += vlen.next_multiple_of(4);
        }
        let gbuf = gpu.alloc_zeroed(goff.max(8) as usize).expect("alloc");
        let vbuf = gpu.alloc_zeroed(voff.max(8) as usize).expect("alloc");
        for &(g, v, _, raw) in &layout {
            let codec = if raw {
                deltacast_cuda::CodeValues::Raw
            } else {
                deltacast_cuda::CodeValues::Ulp
            };
            places.push(deltacast_cuda::CodePlace {
                gaps: Some(gbuf.ptr() + g),
                values: Some((codec, vbuf.ptr() + v)),
            });
        }
        // SAFETY: destinations zeroed and sized above.
        unsafe { gpu.entropy_write(&mut scratch, &chunks, &places) }.expect("write");
        let gots = dl(&gpu, gbuf.ptr(), goff.max(8) as usize);
        let gotv = dl(&gpu, vbuf.ptr(), voff.max(8) as usize);
        for (i, &(g, v, vlen, raw)) in layout.iter().enumerate() {
            let g = g as usize;
            assert_eq!(
                &gots[g..g + want_gaps[i].len()],
                &want_gaps[i][..],
                "round {round} case {i} (width {}, count {}, range {}): gaps bytes",
                cases[i].width,
                cases[i].rel.len(),
                cases[i].range
            );
            let want_v = if raw { &rebased[i].new } else { &want_ulp[i] };
            let v = v as usize;
            assert_eq!(vlen as usize, want_v.len());
            assert_eq!(
                &gotv[v..v + want_v.len()],
                &want_v[..],
                "round {round} case {i} (width {}, count {}): value bytes (raw {raw})",
                cases[i].width,
                cases[i].rel.len()
            );
        }
        // Writing other chunks than those sized is refused.
        assert!(unsafe { gpu.entropy_write(&mut scratch, &chunks[1..], &places[1..]) }.is_err());
    }
}

/// Sections of `cases` (core-encoded) decoded on the GPU; per chunk the outcome and, when
/// it decoded, the positions and new bits.
type Decoded = Vec<Result<(Vec<u32>, Vec<u8>), String>>;

fn gpu_decode(
    gpu: &Gpu,
    cases: &[CodeCase],
    gaps: &[Vec<u8>],
    ulp: &[Vec<u8>],
    abs32: bool,
) -> Decoded {
    use deltacast_cuda::{DecodeInput, DecodePositions, DECODE_SLACK};
    // Sections packed 4-aligned, with slack at the end; slots hold the old bits at the
    // positions (and noise elsewhere).
    let mut psec = Vec::new();
    let mut vsec = Vec::new();
    let mut places = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let p = if abs32 {
            c.rel.iter().flat_map(|r| r.to_le_bytes()).collect()
        } else {
            gaps[i].clone()
        };
        let (po, vo) = (psec.len(), vsec.len());
        psec.extend_from_slice(&p);
        vsec.extend_from_slice(&ulp[i]);
        places.push((po, p.len(), vo, ulp[i].len()));
        while psec.len() % 4 != 0 {
            psec.push(0);
        }
        while vsec.len() % 4 != 0 {
            vsec.push(0);
        }
    }
    psec.resize(psec.len() + DECODE_SLACK as usize, 0);
    vsec.resize(vsec.len() + DECODE_SLACK as usize, 0);
    let pbuf = gpu.upload(&psec).expect("upload");
    let vbuf = gpu.upload(&vsec).expect("upload");
    let mut slots = Vec::new();
    let mut outs = Vec::new();
    let mut inputs = Vec::new();
    let mut rng = Rng(cases.len() as u64);
    for (c, &(po, plen, vo, vlen)) in cases.iter().zip(&places) {
        let numel = c.start as usize + c.range as usize;
        let mut held = rng.bytes(numel.min(1 << 24) * c.width);
        if numel > 1 << 24 {
            held.resize(numel * c.width, 0);
        }
        for (k, &r) in c.rel.iter().enumerate() {
            let at = (c.start as usize + r as usize) * c.width;
            held[at..at + c.width].copy_from_slice(&c.old[k * c.width..(k + 1) * c.width]);
        }
        let slot = gpu.upload(&held).expect("upload");
        let pout = gpu
            .alloc_zeroed(c.rel.len() * 4 + DECODE_SLACK as usize)
            .expect("alloc");
        let vout = gpu.alloc_zeroed(c.rel.len() * c.width + 8).expect("alloc");
        let positions = if abs32 {
            DecodePositions::Abs32 {
                section: pbuf.ptr() + po as u64,
                len: plen as u64,
            }
        } else {
            DecodePositions::Gaps {
                section: pbuf.ptr() + po as u64,
                len: plen as u64,
                out: pout.ptr(),
            }
        };
        inputs.push(DecodeInput {
            held: slot.ptr(),
            slot_numel: numel as u64,
            width: c.width,
            start: c.start,
            range: c.range as u64,
            count: c.rel.len() as u64,
            positions,
            values: Some((vbuf.ptr() + vo as u64, vlen as u64, vout.ptr())),
        });
        slots.push(slot);
        outs.push((pout, vout));
    }
    let mut scratch = deltacast_cuda::CodeScratch::new();
    // SAFETY: sections with slack, outputs and slots sized above.
    let errors = unsafe { gpu.entropy_decode(&mut scratch, &inputs) }.expect("decode");
    cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if let Some(e) = errors.iter().find(|e| e.chunk == i) {
                return Err(e.reason.to_string());
            }
            let pos = if abs32 {
                c.rel.clone()
            } else {
                dl(gpu, outs[i].0.ptr(), c.rel.len() * 4)
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                    .collect()
            };
            Ok((pos, dl(gpu, outs[i].1.ptr(), c.rel.len() * c.width)))
        })
        .collect()
}

/// The core's decode of the same sections: positions, then values from the old bits at them.
fn cpu_decode(
    c: &CodeCase,
    gaps: &[u8],
    ulp: &[u8],
    abs32: bool,
) -> Result<(Vec<u32>, Vec<u8>), String> {
    use deltacast::codec::decode_positions;
    let n = c.rel.len() as u32;
    let mut pos = Vec::new();
    if abs32 {
        pos = c.rel.clone();
    } else {
        decode_positions(PosCodec::Gaps, gaps, n, c.range, &mut pos).map_err(|e| e.to_string())?;
    }
    // The old bits the receiver holds at the decoded positions (the case's old bits where
    // they are the case's positions; the test's slots hold exactly those there).
    let mut old = Vec::new();
    for &p in &pos {
        match c.rel.binary_search(&p) {
            Ok(k) => old.extend_from_slice(&c.old[k * c.width..(k + 1) * c.width]),
            Err(_) => return Err("positions moved: compared by the caller".into()),
        }
    }
    let mut new = Vec::new();
    deltacast::codec::decode_values(ValCodec::Ulp, c.width, ulp, &old, &mut new)
        .map_err(|e| e.to_string())?;
    Ok((pos, new))
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn entropy_decoders_match_the_core() {
    let gpu = gpu();
    let mut rng = Rng(0xdec);
    let cases: Vec<CodeCase> = code_cases(&mut rng)
        .into_iter()
        .filter(|c| c.range < 50_000_000) // slots of the test stay small
        .map(|c| CodeCase {
            start: c.start + c.rel[0] as u64,
            range: c.range - c.rel[0],
            rel: c.rel.iter().map(|&r| r - c.rel[0]).collect(),
            ..c
        })
        .collect();
    let gaps: Vec<Vec<u8>> = cases.iter().map(cpu_gaps).collect();
    let ulp: Vec<Vec<u8>> = cases.iter().map(cpu_ulp).collect();
    for abs32 in [false, true] {
        let got = gpu_decode(&gpu, &cases, &gaps, &ulp, abs32);
        for (i, c) in cases.iter().enumerate() {
            let (pos, new) = got[i].clone().unwrap_or_else(|e| panic!("case {i}: {e}"));
            assert_eq!(pos, c.rel, "case {i} positions (abs32 {abs32})");
            assert_eq!(new, c.new, "case {i} values (abs32 {abs32})");
        }
    }
    // Damaged sections: the GPU accepts exactly what the core accepts, with the same result.
    let small: Vec<usize> = (0..cases.len())
        .filter(|&i| cases[i].rel.len() <= 3000)
        .collect();
    let mut checked = (0, 0);
    for trial in 0..300 {
        let i = small[rng.below(small.len() as u64) as usize];
        let (mut g, mut u) = (gaps[i].clone(), ulp[i].clone());
        let target = if trial % 2 == 0 { &mut g } else { &mut u };
        if target.is_empty() {
            continue;
        }
        match rng.below(4) {
            0 => {
                let at = rng.below(target.len() as u64) as usize;
                target[at] ^= 1 << rng.below(8);
            }
            1 => {
                let at = rng.below(target.len() as u64) as usize;
                target[at] = rng.next_u64() as u8;
            }
            2 => {
                target.pop();
            }
            _ => target.push(rng.next_u64() as u8),
        }
        let case = [CodeCase {
            width: cases[i].width,
            start: cases[i].start,
            range: cases[i].range,
            rel: cases[i].rel.clone(),
            old: cases[i].old.clone(),
            new: cases[i].new.clone(),
        }];
        let got = gpu_decode(&gpu, &case, &[g.clone()], &[u.clone()], false).remove(0);
        let want = cpu_decode(&case[0], &g, &u, false);
        let moved = matches!(&want, Err(e) if e.starts_with("positions moved"));
        match (&got, &want) {
            (Ok((pos, _)), Err(_)) if moved => {
                // The positions decoded to others: the GPU's ulp read the slot's other bits
                // there; the positions themselves must be what the core decodes.
                let mut cpu_pos = Vec::new();
                deltacast::codec::decode_positions(
                    PosCodec::Gaps,
                    &g,
                    case[0].rel.len() as u32,
                    case[0].range,
                    &mut cpu_pos,
                )
                .expect("the core accepted these positions");
                assert_eq!(pos, &cpu_pos, "trial {trial}");
                checked.0 += 1;
            }
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b, "trial {trial}: both accepted, different results");
                checked.0 += 1;
            }
            (Err(_), Err(_)) if !moved => checked.1 += 1,
            _ => panic!("trial {trial} case {i}: GPU {got:?} vs core {want:?}"),
        }
    }
    assert!(checked.0 > 0 && checked.1 > 50, "{checked:?}");
}
