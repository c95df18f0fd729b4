//! Writes the seed corpora of fuzz/seeds/ from the golden frames in
//! crates/deltacast/tests/golden/: `cargo run --manifest-path fuzz/Cargo.toml --example seeds`.
//! Each target's input layout is in its own source; the frames themselves seed `frame`,
//! `manifest` and `apply` directly (fuzz-smoke.sh adds the golden folder to their corpora).

use std::path::Path;

use deltacast::codec::CodecChoice;
use deltacast::dtype::{from_ordered, load_bits, store_bits, to_ordered};
use deltacast::wire::{parse_frame, split_frames};
use deltacast::{FlushConfig, PosCodec, Sender, ValCodec};
use deltacast_fuzz::mixed;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let golden = root.join("../crates/deltacast/tests/golden");
    let out = root.join("seeds");
    let write = |target: &str, name: String, bytes: &[u8]| {
        let dir = out.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    let mut files: Vec<_> = std::fs::read_dir(&golden)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    // `apply`, recorded mode: the small golden seed then its delta, on one fresh receiver.
    let small: Vec<u8> = ["seed_v1.dcast", "delta_v2_abs32_raw.dcast"]
        .iter()
        .flat_map(|f| std::fs::read(golden.join(f)).unwrap())
        .collect();
    write("apply", "seed_then_delta".into(), &small);
    for path in files {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let stream = std::fs::read(&path).unwrap();
        // `apply`, resealing mode: a mode byte ≡ 0 mod 4, then the frames.
        write(
            "apply",
            format!("{stem}.resealed"),
            &[&[0u8][..], &stream].concat(),
        );
        for (f, frame) in split_frames(&stream).unwrap().into_iter().enumerate() {
            let frame = parse_frame(frame).unwrap();
            let widths = if stem.contains("v5") { [2, 1] } else { [2, 4] };
            for (e, entry) in frame.entries.iter().enumerate() {
                let name = format!("{stem}.f{f}.e{e}");
                // codec_positions: codec, range u32, count u32, section.
                let mut pos = vec![entry.pos_codec as u8];
                pos.extend_from_slice(&(entry.range as u32).to_le_bytes());
                pos.extend_from_slice(&(entry.count as u32).to_le_bytes());
                pos.extend_from_slice(frame.positions(entry));
                write("codec_positions", name.clone(), &pos);
                // codec_values: codec | width index << 2, count u16, old-bits seed, section.
                let width = widths[entry.slot as usize];
                let sel = entry.val_codec as u8
                    | ([1, 2, 4].iter().position(|&w| w == width).unwrap() as u8) << 2;
                let mut val = vec![sel];
                val.extend_from_slice(&(entry.count as u16).to_le_bytes());
                val.push(0);
                val.extend_from_slice(frame.values(entry));
                write("codec_values", name, &val);
            }
        }
    }
    // Sections of each codec the goldens may lack, from the library's encoders.
    let rel: Vec<u32> = (0..3000).filter(|i| i % 3 != 1).collect();
    // (`ctx` and `ctxgaps` positions need the chunk's bits: codec_context seeds itself;
    // `steps` positions need their values: below.)
    for codec in PosCodec::ALL
        .into_iter()
        .filter(|&c| !c.needs_held() && c != PosCodec::Steps)
    {
        let rel: Vec<u32> = if codec == PosCodec::All {
            (0..3000).collect()
        } else {
            rel.clone()
        };
        let mut section = Vec::new();
        deltacast::codec::encode_positions(codec, &rel, 3000, &mut section);
        let mut pos = vec![codec as u8];
        pos.extend_from_slice(&3000u32.to_le_bytes());
        pos.extend_from_slice(&(rel.len() as u32).to_le_bytes());
        pos.extend_from_slice(&section);
        write("codec_positions", format!("encoded.{}", codec.name()), &pos);
    }
    for (wi, width) in [1usize, 2, 4].into_iter().enumerate() {
        let n = 1500usize;
        let old: Vec<u8> = (0..n * width)
            .map(|i| (i as u8).wrapping_mul(0x9d) ^ (i >> 8) as u8)
            .collect();
        let mut new = old.clone();
        for (i, b) in new.iter_mut().enumerate() {
            if i % width == 0 {
                *b = b.wrapping_add((i % 3) as u8);
            }
        }
        for codec in ValCodec::ALL.into_iter().filter(|&c| {
            c != ValCodec::Escaped
                && (c != ValCodec::Context || deltacast::codec::context_supports(width))
        }) {
            let mut section = Vec::new();
            deltacast::codec::encode_values(codec, width, &old, &new, &mut section);
            let mut val = vec![codec as u8 | (wi as u8) << 2];
            val.extend_from_slice(&(n as u16).to_le_bytes());
            val.push(0);
            val.extend_from_slice(&section);
            write(
                "codec_values",
                format!("encoded.{}.w{width}", codec.name()),
                &val,
            );
        }
        // codec_positions, `steps`: codec + 7 · width index, range, count, the map then the
        // escapes, of the positions above (steps of +1, −1 and +2 ULPs: every code) and the
        // target's own old bits (keyed by the count's second byte).
        let rel: Vec<u32> = (0..3000).filter(|i| i % 3 != 1).collect();
        let key = (rel.len() as u32).to_le_bytes()[1];
        let old: Vec<u8> = (0..rel.len() * width)
            .map(|i| (i as u8).wrapping_mul(0x9d).wrapping_add(key) ^ (i >> 8) as u8)
            .collect();
        let mut new = old.clone();
        for k in 0..rel.len() {
            let a = load_bits(&old, width, k);
            let step = [1u32, u32::MAX, 2][k % 3];
            let mask = if width == 4 {
                u32::MAX
            } else {
                (1 << (8 * width)) - 1
            };
            store_bits(
                &mut new,
                width,
                k,
                from_ordered(to_ordered(a, width).wrapping_add(step) & mask, width),
            );
        }
        let (mut map, mut esc) = (Vec::new(), Vec::new());
        deltacast::codec::encode_steps(width, &rel, 3000, &old, &new, &mut map, &mut esc);
        let sel = PosCodec::Steps as u8 + PosCodec::ALL.len() as u8 * wi as u8;
        let mut pos = vec![sel];
        pos.extend_from_slice(&3000u32.to_le_bytes());
        pos.extend_from_slice(&(rel.len() as u32).to_le_bytes());
        pos.extend_from_slice(&map);
        pos.extend_from_slice(&esc);
        write("codec_positions", format!("encoded.steps.w{width}"), &pos);
    }
    // `frame` and `manifest`: a delta sync coded with `auto+ctx`, which the goldens lack: the
    // `mixed` scenario's slots holding values of a few exponents (where `ctx` is the smaller
    // code), 1 in 8 elements stepped by one or two ULPs, small chunks and frames.
    let mut scenario = mixed();
    for (slot, bytes) in scenario.store.iter_mut().enumerate() {
        let w = scenario.table.slots()[slot].dtype.width();
        let base: u32 = match w {
            4 => 0x3f80_0000,
            2 => 0x3c00,
            _ => 0x38,
        };
        for i in 0..bytes.len() / w {
            store_bits(bytes, w, i, base + (i as u32 * 37) % 61);
        }
    }
    let config = FlushConfig {
        bucket_size: 2048,
        chunk_elems: 256,
        codec: CodecChoice::AutoContext,
    };
    let version = scenario.version.unwrap_or(0);
    let mut sender = Sender::with_base(
        scenario.table.clone(),
        config,
        scenario.store.clone(),
        version,
    )
    .unwrap();
    let mut next = scenario.store.clone();
    for (slot, bytes) in next.iter_mut().enumerate() {
        let w = scenario.table.slots()[slot].dtype.width();
        for i in (0..bytes.len() / w).filter(|i| (i * 7 + slot) % 8 == 0) {
            let step = 1 + (i % 2) as u32;
            let bits = from_ordered(to_ordered(load_bits(bytes, w, i), w).wrapping_add(step), w);
            store_bits(bytes, w, i, bits);
        }
    }
    let slices: Vec<&[u8]> = next.iter().map(Vec::as_slice).collect();
    let mut stream = Vec::new();
    sender
        .delta(&slices, |frame| {
            stream.extend_from_slice(&frame);
            Ok(())
        })
        .unwrap();
    let ctx_chunks = split_frames(&stream)
        .unwrap()
        .into_iter()
        .flat_map(|f| parse_frame(f).unwrap().entries)
        .filter(|e| e.pos_codec.needs_held() || e.val_codec == ValCodec::Context)
        .count();
    assert!(ctx_chunks > 0, "the auto+ctx seed has no ctx chunk");
    write("frame", "ctx_delta.dcast".into(), &stream);
    write("manifest", "ctx_delta.dcast".into(), &stream);
}
