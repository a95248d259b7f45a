//! Field buffers given back once their sample is done with, for the next fields a reader
//! reads.
//!
//! A reader that allocates every field afresh pays for new pages each time: an image of
//! ~110 KB is over the size glibc serves from its free lists once the heap around it has
//! been trimmed, so each one is faulted in and zeroed again. On a worker that reads a sample
//! for each of a sweep's jobs, `perf` put those faults and that zeroing at ~6% of the
//! worker's CPU. A reader given [`Spares`] ([`crate::SampleReader::with_spares`]) reads into
//! a buffer from them, and whoever is done with a sample gives its buffers back.

use std::sync::{Arc, Mutex};

use crate::sample::Sample;

/// Buffers smaller than this are not kept: the allocator serves them from its free lists
/// without new pages.
const SMALLEST: usize = 16 << 10;

/// Buffers larger than this are not kept: a rare large field should not pin its memory.
const LARGEST: usize = 8 << 20;

/// How many of the newest spares [`Spares::take`] looks through for one that fits.
const FIT_SCAN: usize = 16;

/// A bounded stack of spare field buffers, shared by readers and the threads that finish
/// with their samples.
#[derive(Debug)]
pub struct Spares {
    stack: Mutex<Stack>,
    /// At most this many bytes of buffers are kept.
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Stack {
    buffers: Vec<Vec<u8>>,
    /// Their capacities, summed.
    bytes: usize,
}

impl Spares {
    /// Spares keeping at most `max_bytes` of buffers (each from 16 KiB to 8 MiB).
    pub fn new(max_bytes: usize) -> Self {
        Spares {
            stack: Mutex::default(),
            max_bytes,
        }
    }

    /// A buffer for a field of `size` bytes: a spare when the field is large enough to be
    /// worth one and there is one (its old bytes still in it, for the caller to read over),
    /// else an empty one.
    pub(crate) fn take(&self, size: u64) -> Vec<u8> {
        if size < SMALLEST as u64 {
            return Vec::new();
        }
        let Ok(mut s) = self.stack.lock() else {
            return Vec::new();
        };
        // The newest spare that holds the field without growing (its bytes are read over
        // as they are), else the newest.
        let top = s.buffers.len();
        let fits = (top.saturating_sub(FIT_SCAN)..top)
            .rev()
            .find(|&i| s.buffers[i].len() as u64 >= size);
        let at = match fits {
            Some(at) => at,
            None if top > 0 => top - 1,
            None => return Vec::new(),
        };
        let buf = s.buffers.swap_remove(at);
        s.bytes -= buf.capacity();
        buf
    }

    /// Keeps the buffers of `sample`'s fields for the next reads (those of a size worth
    /// keeping, while there is room).
    pub fn give_back(&self, sample: Sample) {
        let Ok(mut stack) = self.stack.lock() else {
            return;
        };
        for field in sample.fields {
            let bytes = field.data.capacity();
            if (SMALLEST..=LARGEST).contains(&bytes) && stack.bytes + bytes <= self.max_bytes {
                stack.bytes += bytes;
                stack.buffers.push(field.data);
            }
        }
    }

    /// [`Spares::give_back`] for a sample several hold (the units of a sweep that read it
    /// together): its buffers go back with the last of them, and stay with the others.
    pub fn give_back_shared(&self, sample: Arc<Sample>) {
        if let Ok(sample) = Arc::try_unwrap(sample) {
            self.give_back(sample);
        }
    }

    /// How many buffers it holds now.
    pub fn len(&self) -> usize {
        self.stack.lock().map(|s| s.buffers.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::{ReadOptions, SampleReader};
    use crate::write::encode_sample;

    fn shard(samples: &[(&str, usize)]) -> Vec<u8> {
        let mut tar = Vec::new();
        for (key, size) in samples {
            let image = vec![0xAB; *size];
            encode_sample(key, &[("jpg", &image[..]), ("cls", b"7")], &mut tar).unwrap();
        }
        tar.extend([0u8; 1024]);
        tar
    }

    #[test]
    fn a_reader_reads_into_buffers_given_back_and_its_samples_are_unchanged() {
        let tar = shard(&[("a", 100_000), ("b", 90_000), ("c", 80_000)]);
        let plain: Vec<Sample> = SampleReader::new(&tar[..], "s.tar", &ReadOptions::default())
            .collect::<Result<_, _>>()
            .unwrap();
        let spares = Arc::new(Spares::new(1 << 20));
        let mut reader = SampleReader::new(&tar[..], "s.tar", &ReadOptions::default())
            .with_spares(spares.clone());
        let first = reader.next().unwrap().unwrap();
        assert_eq!(first, plain[0]);
        let image = first.fields[0].data.as_ptr();
        spares.give_back(first);
        // The image's buffer is kept; the label's few bytes are not worth keeping.
        assert_eq!(spares.len(), 1);
        // The reader reads one entry ahead (a sample ends where the next key starts): the
        // second image was read before the first came back, the third into its buffer.
        let second = reader.next().unwrap().unwrap();
        assert_eq!(second, plain[1]);
        assert!(spares.is_empty());
        let third = reader.next().unwrap().unwrap();
        assert_eq!(third, plain[2]);
        assert_eq!(third.fields[0].data.as_ptr(), image, "read into the spare");
        assert!(reader.next().is_none());
    }

    #[test]
    fn a_shared_sample_goes_back_with_its_last_holder() {
        let tar = shard(&[("a", 100_000)]);
        let spares = Spares::new(1 << 20);
        let mut reader = SampleReader::new(&tar[..], "s.tar", &ReadOptions::default());
        let sample = Arc::new(reader.next().unwrap().unwrap());
        let other = sample.clone();
        spares.give_back_shared(sample);
        assert!(spares.is_empty(), "another unit still holds it");
        spares.give_back_shared(other);
        assert_eq!(spares.len(), 1);
    }

    #[test]
    fn a_field_cut_short_is_an_error_whether_or_not_it_is_read_into_a_spare() {
        let tar = shard(&[("a", 100_000), ("b", 90_000), ("c", 80_000)]);
        // Cut inside c's image.
        let cut = &tar[..tar.len() - 1024 - 512 - 512 - 40_000];
        let spares = Arc::new(Spares::new(1 << 20));
        let mut reader =
            SampleReader::new(cut, "s.tar", &ReadOptions::default()).with_spares(spares.clone());
        spares.give_back(reader.next().unwrap().unwrap());
        // c's image is read into a's buffer, and found cut short.
        let err = reader.next().unwrap().unwrap_err().to_string();
        let plain = SampleReader::new(cut, "s.tar", &ReadOptions::default())
            .find_map(Result::err)
            .unwrap()
            .to_string();
        assert_eq!(err, plain);
        assert!(err.contains("s.tar"), "{err}");
    }

    #[test]
    fn it_keeps_at_most_its_bound() {
        let tar = shard(&[("a", 20_000), ("b", 20_000), ("c", 20_000)]);
        // Room for two of the three images' buffers.
        let spares = Spares::new(50_000);
        for s in SampleReader::new(&tar[..], "s.tar", &ReadOptions::default()) {
            spares.give_back(s.unwrap());
        }
        assert_eq!(spares.len(), 2);
    }
}
