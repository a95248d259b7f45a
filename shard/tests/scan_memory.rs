//! `scan_shard` (what `sluice index`, `sluice inspect` and a brace-pattern dataset read
//! shards with) holds none of a sample's bytes: indexing a shard whose sample is hundreds of
//! megabytes allocates a few megabytes, measured by this binary's allocator. (It read each
//! sample whole, twice over: 1.65 GB for two 800 MB samples.) Alone in its binary, so no other
//! test's allocations are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};

use sluice_shard::tar::header::ustar;
use sluice_shard::{scan_shard, ReadOptions};

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A tar stream made as it is read: headers from a list, data as zeros, nothing stored.
struct Synthetic {
    parts: Vec<(Vec<u8>, u64)>,
    at: usize,
    /// Bytes of the current part's header given, then of its zeros.
    header_done: usize,
    zeros_done: u64,
}

impl Synthetic {
    /// Entries (name, size); each is a header, its data as zeros and the padding.
    fn new(entries: &[(&str, u64)]) -> Self {
        let mut parts: Vec<(Vec<u8>, u64)> = entries
            .iter()
            .map(|(name, size)| {
                let padded = size.div_ceil(512) * 512;
                (ustar(name.as_bytes(), *size, b'0').to_vec(), padded)
            })
            .collect();
        parts.push((vec![0u8; 1024], 0));
        Synthetic {
            parts,
            at: 0,
            header_done: 0,
            zeros_done: 0,
        }
    }
}

impl Read for Synthetic {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some((header, zeros)) = self.parts.get(self.at) else {
            return Ok(0);
        };
        if self.header_done < header.len() {
            let n = (header.len() - self.header_done).min(buf.len());
            buf[..n].copy_from_slice(&header[self.header_done..self.header_done + n]);
            self.header_done += n;
            return Ok(n);
        }
        if self.zeros_done < *zeros {
            let n = ((*zeros - self.zeros_done) as usize).min(buf.len());
            buf[..n].fill(0);
            self.zeros_done += n as u64;
            return Ok(n);
        }
        self.at += 1;
        self.header_done = 0;
        self.zeros_done = 0;
        self.read(buf)
    }
}

#[test]
fn indexing_a_huge_sample_holds_none_of_it() {
    const ENTRY: u64 = 200 << 20;
    let shard = Synthetic::new(&[
        ("big.jpg", ENTRY),
        ("big.npy", ENTRY),
        ("big.cls", 1),
        ("small.jpg", 1000),
    ]);
    let before = NOW.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let mut seen = Vec::new();
    let (info, index) = scan_shard(shard, "huge.tar", &ReadOptions::default(), |s| {
        seen.push((s.key.clone(), s.payload_bytes()));
    })
    .unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!(info.samples, 2);
    assert_eq!(
        seen,
        [("big".to_string(), 2 * ENTRY + 1), ("small".into(), 1000)]
    );
    assert_eq!(index.entries[0].len, 2 * (512 + ENTRY) + 1024);
    assert!(
        peak < 16 << 20,
        "indexing a {} MB sample allocated {} MB at its peak",
        (2 * ENTRY) >> 20,
        peak >> 20
    );
}
