//! A link that turns a GPU sync into frames of the core's format and back, so that a GPU
//! sync leaves the device: a [`GpuSender`](crate::sync::GpuSender) on a capture link writes
//! each stage as a file frame (to a file, a socket, anything that writes), and a
//! [`GpuReceiver`](crate::sync::GpuReceiver) on a replay link applies the syncs it reads,
//! whoever made them (a CPU `deltacast::Sender`, `deltacast diff`, a captured GPU sync).
//!
//! It is a link of two ranks: the capture side is the root (rank 0), the replay side the
//! receiver (rank 1); the other end is the byte stream. Every part moves through host
//! memory, so this is for leaving the device, not for speed.

use std::collections::VecDeque;
use std::io::{Cursor, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::sys;
use deltacast::wire;

use crate::error::{CudaError, Result};
use crate::protocol::{device_parts_reusing, FrameAssembler};
use crate::wait::{event_done, poll, Deadline};
use crate::{DevicePtr, Gpu};

enum End {
    /// Root: the assembled frames go to `sink`.
    Capture {
        assembler: FrameAssembler,
        sink: Mutex<Box<dyn Write + Send>>,
    },
    /// Receiver: the parts of the next sync read from `source`, in order.
    Replay {
        source: Mutex<Box<dyn FrameSource>>,
        parts: std::collections::VecDeque<Vec<u8>>,
        /// Parts copied to the device, whose memory the next sync's parts reuse.
        spare: Vec<Vec<u8>>,
        /// The last ack this receiver gave (1: it refused).
        refused: bool,
    },
}

/// A link whose other end is a stream of frames (see the module above).
pub struct FrameLink {
    gpu: Gpu,
    end: End,
}

fn io(op: &'static str) -> impl Fn(std::io::Error) -> CudaError {
    move |e| CudaError::Link {
        op,
        msg: e.to_string(),
    }
}

impl FrameLink {
    /// The root's end: a sender on this link writes each stage it sends to `sink` as a
    /// frame (checksummed), a close as a close frame.
    pub fn capture(gpu: Gpu, sink: impl Write + Send + 'static) -> FrameLink {
        FrameLink {
            gpu,
            end: End::Capture {
                assembler: FrameAssembler::new(),
                sink: Mutex::new(Box::new(sink)),
            },
        }
    }

    /// A receiver's end: each sync is read from `source` (frames back to back, as `.dcast`
    /// files hold them); the end of the stream reads as the sender's close.
    pub fn replay(gpu: Gpu, source: impl Read + Send + 'static) -> FrameLink {
        FrameLink::replay_from(gpu, Box::new(ReadFrames(source)))
    }

    /// A receiver's end reading the frames pushed to `queue` (each handed over whole, not
    /// copied again).
    pub fn replay_queue(gpu: Gpu, queue: FrameQueue) -> FrameLink {
        FrameLink::replay_from(gpu, Box::new(queue))
    }

    fn replay_from(gpu: Gpu, source: Box<dyn FrameSource>) -> FrameLink {
        FrameLink {
            gpu,
            end: End::Replay {
                source: Mutex::new(source),
                parts: Default::default(),
                spare: Vec::new(),
                refused: false,
            },
        }
    }

    pub fn rank(&self) -> usize {
        match self.end {
            End::Capture { .. } => 0,
            End::Replay { .. } => 1,
        }
    }

    pub fn nranks(&self) -> usize {
        2
    }

    /// Whether the receiver refused the last sync it acked (replay end).
    pub fn refused(&self) -> bool {
        matches!(self.end, End::Replay { refused: true, .. })
    }

    /// The capture end takes `len` bytes at `src` as the next part of a stage; the replay
    /// end writes the next part of the sync being read to `dst`, which must be `len` bytes.
    ///
    /// # Safety
    /// `src` (capture) or `dst` (replay) must be device memory valid for `len` bytes, and
    /// `stream` a live stream of the GPU's context.
    pub unsafe fn broadcast(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        len: usize,
        stream: u64,
    ) -> Result<()> {
        // Our copies follow what the caller enqueued before on its stream.
        // SAFETY: per this function's contract.
        unsafe { self.gpu.wait_for_stream(stream)? };
        match &mut self.end {
            End::Capture { assembler, sink } => {
                // SAFETY: per this function's contract; ordered after `stream` above.
                let part = unsafe { self.gpu.download(src, len)? };
                if let Some(frame) = assembler.push(&part)? {
                    let sink = sink.get_mut().unwrap_or_else(|p| p.into_inner());
                    sink.write_all(&frame).map_err(io("write"))?;
                    sink.flush().map_err(io("flush"))?;
                }
                Ok(())
            }
            End::Replay {
                source,
                parts,
                spare,
                ..
            } => {
                if parts.is_empty() {
                    let source = source.get_mut().unwrap_or_else(|p| p.into_inner());
                    *parts = read_sync(source.as_mut(), spare)?.into();
                }
                let part = parts.pop_front().unwrap_or_default();
                if part.len() != len {
                    parts.clear();
                    return Err(CudaError::Protocol(format!(
                        "the frames carry a part of {} bytes where this receiver takes {len}: \
                         not a sync of its slots",
                        part.len()
                    )));
                }
                // SAFETY: per this function's contract; ordered after `stream` above.
                unsafe { self.gpu.copy_to_device(dst, &part)? };
                keep_spare(spare, part);
                Ok(())
            }
        }
    }

    /// The ack: nothing to combine on the capture end (no receiver refuses); the replay end
    /// keeps its own.
    ///
    /// # Safety
    /// `buf` must hold `count` u64 of device memory; `stream` a live stream.
    pub unsafe fn all_reduce_max_u64(
        &mut self,
        buf: DevicePtr,
        count: usize,
        stream: u64,
    ) -> Result<()> {
        if let End::Replay { refused, parts, .. } = &mut self.end {
            // SAFETY: per this function's contract.
            unsafe { self.gpu.wait_for_stream(stream)? };
            // SAFETY: per this function's contract.
            let words = unsafe { self.gpu.download(buf, count * 8)? };
            *refused = words.iter().any(|&b| b != 0);
            // A refused sync's remaining parts (none, when the receiver took them all).
            parts.clear();
        }
        Ok(())
    }

    pub fn wait(&mut self, event: u64, timeout: Duration, what: &'static str) -> Result<()> {
        poll(Deadline::after(timeout), what, || {
            event_done(event as sys::CUevent)
        })
    }

    pub fn abort(&mut self) {
        if let End::Replay { parts, .. } = &mut self.end {
            parts.clear();
        }
    }
}

/// How many parts' buffers a replay link keeps for the next sync (a delta's positions and
/// values, with room to spare).
const SPARE_PARTS: usize = 4;

/// Keeps `part`'s memory for the next sync's parts: the largest few buffers.
fn keep_spare(spare: &mut Vec<Vec<u8>>, part: Vec<u8>) {
    spare.push(part);
    if spare.len() > SPARE_PARTS {
        if let Some(i) = (0..spare.len()).min_by_key(|&i| spare[i].capacity()) {
            spare.swap_remove(i);
        }
    }
}

/// One frame's bytes: owned, or kept in place by whoever handed them over (a Python `bytes`
/// object), read without a copy.
pub struct FrameBytes(Box<dyn AsRef<[u8]> + Send>);

impl FrameBytes {
    pub fn new(bytes: impl AsRef<[u8]> + Send + 'static) -> FrameBytes {
        FrameBytes(Box::new(bytes))
    }
}

impl AsRef<[u8]> for FrameBytes {
    fn as_ref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

/// Where a replay link's frames come from: whole frames, one at a time, `None` at a clean end
/// of the stream.
trait FrameSource: Send {
    fn next_frame(&mut self) -> Result<Option<FrameBytes>>;
}

/// Frames read back to back from a byte stream (a file, a socket).
struct ReadFrames<R>(R);

impl<R: Read + Send> FrameSource for ReadFrames<R> {
    fn next_frame(&mut self) -> Result<Option<FrameBytes>> {
        Ok(read_frame(&mut self.0)?.map(FrameBytes::new))
    }
}

/// The next frame of `source`, read as far as the stream holds it (never sized by its claim
/// alone); `None` at a clean end.
fn read_frame(source: &mut dyn Read) -> Result<Option<Vec<u8>>> {
    let mut head = [0u8; wire::HEADER_LEN];
    if !read_exact_or_end(source, &mut head)? {
        return Ok(None);
    }
    let header =
        wire::FrameHeader::decode(&head).map_err(|e| CudaError::Protocol(e.to_string()))?;
    let mut frame = head.to_vec();
    let rest = header.frame_len - wire::HEADER_LEN as u64;
    let got = source
        .take(rest)
        .read_to_end(&mut frame)
        .map_err(io("read"))?;
    if got as u64 != rest {
        return Err(CudaError::Protocol(format!(
            "a frame of {} bytes cut short at {}",
            header.frame_len,
            frame.len()
        )));
    }
    Ok(Some(frame))
}

impl FrameSource for FrameQueue {
    /// A buffer pushed whole and holding exactly one frame is handed over as it is; anything
    /// else (several frames in one push, a frame split over pushes) is read as a stream.
    fn next_frame(&mut self) -> Result<Option<FrameBytes>> {
        {
            let mut frames = self.lock();
            while frames
                .front()
                .is_some_and(|f| f.get_ref().as_ref().is_empty())
            {
                frames.pop_front();
            }
            let whole = frames.front().is_some_and(|f| {
                let b = f.get_ref().as_ref();
                f.position() == 0
                    && b.len() >= wire::HEADER_LEN
                    && wire::FrameHeader::decode(&b[..wire::HEADER_LEN])
                        .is_ok_and(|h| h.frame_len == b.len() as u64)
            });
            if whole {
                return Ok(frames.pop_front().map(Cursor::into_inner));
            }
        }
        Ok(read_frame(&mut self.reader())?.map(FrameBytes::new))
    }
}

/// Reads the frames of the next sync (through its `FINAL` frame) and cuts them into device
/// parts (reusing `spare`'s buffers); at the end of the stream, a close.
fn read_sync(source: &mut dyn FrameSource, spare: &mut Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    let mut frames: Vec<FrameBytes> = Vec::new();
    loop {
        let Some(frame) = source.next_frame()? else {
            if frames.is_empty() {
                return Ok(vec![close_header()]);
            }
            return Err(CudaError::Protocol(
                "the frames end in the middle of a sync".into(),
            ));
        };
        // (next_frame decoded the header: the length is its own.)
        let last = wire::FrameHeader::decode(&frame.as_ref()[..wire::HEADER_LEN])
            .map_err(|e| CudaError::Protocol(e.to_string()))?
            .is_final;
        frames.push(frame);
        if last {
            break;
        }
    }
    let refs: Vec<&[u8]> = frames.iter().map(AsRef::as_ref).collect();
    device_parts_reusing(&refs, spare)
}

/// Fills `buf`, or returns `false` at a clean end of the stream (nothing read).
fn read_exact_or_end(source: &mut dyn Read, buf: &mut [u8]) -> Result<bool> {
    let mut at = 0;
    while at < buf.len() {
        match source.read(&mut buf[at..]) {
            Ok(0) if at == 0 => return Ok(false),
            Ok(0) => {
                return Err(CudaError::Protocol(format!(
                    "a frame header cut short at {at} bytes"
                )))
            }
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io("read")(e)),
        }
    }
    Ok(true)
}

/// The header of a close (the stream ended: no sync follows).
fn close_header() -> Vec<u8> {
    crate::protocol::Stage::close(0, 0).encode_header().to_vec()
}

/// Frames handed over one by one (e.g. from Python) for a replay link to read: a shared queue
/// whose [`reader`](FrameQueue::reader) reads the frames pushed so far, in order, and then the
/// end of the stream (until more are pushed).
#[derive(Clone, Default)]
pub struct FrameQueue {
    frames: Arc<Mutex<VecDeque<Cursor<FrameBytes>>>>,
}

impl FrameQueue {
    /// Appends one frame after those pushed before (owned, or any bytes kept alive until
    /// read: they are read in place).
    pub fn push(&self, frame: impl AsRef<[u8]> + Send + 'static) {
        self.lock().push_back(Cursor::new(FrameBytes::new(frame)));
    }

    /// Bytes pushed and not yet read.
    pub fn pending_bytes(&self) -> u64 {
        self.lock()
            .iter()
            .map(|f| f.get_ref().as_ref().len() as u64 - f.position())
            .sum()
    }

    /// Drops every byte not yet read.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// A reader of the queue (for [`FrameLink::replay`]).
    pub fn reader(&self) -> impl Read + Send + 'static {
        QueueReader(self.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Cursor<FrameBytes>>> {
        self.frames.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct QueueReader(FrameQueue);

impl Read for QueueReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut frames = self.0.lock();
        while let Some(front) = frames.front_mut() {
            let n = front.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            frames.pop_front();
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltacast::{DType, FlushConfig, Sender, SlotInfo, SlotTable};

    /// Three syncs of a CPU sender (a seed, then two deltas), each a list of frames.
    fn syncs() -> Vec<Vec<Vec<u8>>> {
        let table = SlotTable::new(vec![
            SlotInfo::new("a", DType::BF16, vec![5000]),
            SlotInfo::new("b", DType::F32, vec![3, 7]),
        ])
        .unwrap();
        let config = FlushConfig {
            bucket_size: deltacast::flush::MIN_BUCKET_SIZE,
            ..FlushConfig::default()
        };
        let mut sender = Sender::new(table, config).unwrap();
        let mut a: Vec<u8> = (0..10_000).map(|i| (i * 7 % 251) as u8).collect();
        let mut b: Vec<u8> = (0..84).map(|i| i as u8).collect();
        let mut out = Vec::new();
        for step in 0..3 {
            a[step * 100] ^= 1;
            b[step * 4] ^= 1;
            let mut frames = Vec::new();
            sender
                .sync(&[&a, &b], |f| {
                    frames.push(f.to_vec());
                    Ok(())
                })
                .unwrap();
            out.push(frames);
        }
        out
    }

    #[test]
    fn a_queue_hands_over_whole_frames_and_reads_the_rest_as_a_stream() {
        let syncs = syncs();
        let all: Vec<Vec<u8>> = syncs.iter().flatten().cloned().collect();
        let stream: Vec<u8> = all.concat();
        // The parts a byte stream of the same frames gives: the reference.
        let mut reader = ReadFrames(Cursor::new(stream.clone()));
        let want: Vec<Vec<Vec<u8>>> = (0..syncs.len())
            .map(|_| read_sync(&mut reader, &mut Vec::new()).unwrap())
            .collect();
        // Pushed one frame per push; as one push of everything; cut at odd places.
        let cuts: [&dyn Fn() -> Vec<Vec<u8>>; 3] =
            [&|| all.clone(), &|| vec![stream.clone()], &|| {
                stream.chunks(977).map(<[u8]>::to_vec).collect()
            }];
        // The parts' buffers go back for the next sync's, as the link gives them back: what
        // a reused buffer held before does not show.
        let mut spare = vec![vec![0xa5; 1 << 16]];
        for cut in cuts {
            let mut q = FrameQueue::default();
            for piece in cut() {
                q.push(piece);
            }
            for w in &want {
                let got = read_sync(&mut q, &mut spare).unwrap();
                assert_eq!(&got, w);
                got.into_iter().for_each(|p| keep_spare(&mut spare, p));
                assert!(spare.len() <= SPARE_PARTS);
            }
            // The end of what was pushed reads as a close.
            assert_eq!(read_sync(&mut q, &mut spare).unwrap(), vec![close_header()]);
        }
        // A sync whose last frame never comes is refused; so is a frame cut short.
        let mut q = FrameQueue::default();
        q.push(syncs[0][0].clone());
        if syncs[0].len() == 1 {
            let f = &syncs[0][0];
            q.clear();
            q.push(f[..f.len() - 1].to_vec());
        }
        assert!(read_sync(&mut q, &mut spare).is_err());
    }

    #[test]
    fn the_queue_reads_what_was_pushed_in_order_then_the_end() {
        let q = FrameQueue::default();
        let mut r = q.reader();
        let mut out = Vec::new();
        assert_eq!(r.read_to_end(&mut out).unwrap(), 0);
        q.push(vec![1, 2, 3]);
        q.push(Vec::new());
        q.push((0..=255).collect::<Vec<u8>>());
        assert_eq!(q.pending_bytes(), 259);
        let mut two = [0u8; 2];
        r.read_exact(&mut two).unwrap();
        assert_eq!(two, [1, 2]);
        assert_eq!(q.pending_bytes(), 257);
        // A read across frames, then the end of what was pushed.
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        let want: Vec<u8> = std::iter::once(3).chain(0..=255).collect();
        assert_eq!(rest, want);
        assert_eq!(q.pending_bytes(), 0);
        // More after the end reads again; clear drops what was not read.
        q.push(vec![9; 10]);
        r.read_exact(&mut two).unwrap();
        assert_eq!(two, [9, 9]);
        q.clear();
        assert_eq!(q.pending_bytes(), 0);
        assert_eq!(r.read(&mut two).unwrap(), 0);
    }
}
