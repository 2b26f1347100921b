//! Caches in front of table files: the block cache (decoded blocks, bounded in bytes) and
//! the table cache (open tables, bounded in count). Both are sharded LRU maps so that
//! readers on different threads rarely meet on a lock; a hit costs a hash, a short
//! critical section and an `Arc` clone.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::table::block::Block;
use crate::table::Table;
use crate::table_store::SharedTableStore;

/// A fast hasher for the caches' integer keys (multiply-rotate mixing; the keys are not
/// chosen by an adversary).
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // Final avalanche so that shard and bucket bits both depend on every input bit.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

const NIL: usize = usize::MAX;

#[derive(Debug)]
struct Node<K, V> {
    key: K,
    value: Option<V>,
    charge: usize,
    prev: usize,
    next: usize,
}

/// One LRU shard: a hash map into a slab of nodes linked most- to least-recently used.
#[derive(Debug)]
struct Shard<K, V> {
    map: IntMap<K, usize>,
    nodes: Vec<Node<K, V>>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
    usage: usize,
    capacity: usize,
}

impl<K: Copy + Hash + Eq, V: Clone> Shard<K, V> {
    fn new(capacity: usize) -> Self {
        Shard {
            map: IntMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            usage: 0,
            capacity,
        }
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next].prev = prev;
        }
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = NIL;
        self.nodes[i].next = self.head;
        if self.head != NIL {
            self.nodes[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn get(&mut self, key: &K) -> Option<V> {
        let i = *self.map.get(key)?;
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
        self.nodes[i].value.clone()
    }

    fn remove_index(&mut self, i: usize) {
        self.unlink(i);
        let key = self.nodes[i].key;
        self.map.remove(&key);
        self.nodes[i].value = None;
        self.usage -= self.nodes[i].charge;
        self.free.push(i);
    }

    fn insert(&mut self, key: K, value: V, charge: usize) {
        if charge > self.capacity {
            // Larger than the whole shard: caching it would evict everything else.
            self.remove(&key);
            return;
        }
        if let Some(&i) = self.map.get(&key) {
            self.remove_index(i);
        }
        let node = Node {
            key,
            value: Some(value),
            charge,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.map.insert(key, i);
        self.push_front(i);
        self.usage += charge;
        while self.usage > self.capacity && self.tail != NIL && self.tail != i {
            let t = self.tail;
            self.remove_index(t);
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some(&i) = self.map.get(key) {
            self.remove_index(i);
        }
    }
}

/// A sharded LRU map charged by a caller-given cost.
#[derive(Debug)]
struct ShardedLru<K, V> {
    shards: Box<[Mutex<Shard<K, V>>]>,
}

impl<K: Copy + Hash + Eq, V: Clone> ShardedLru<K, V> {
    fn new(capacity: usize, shards: usize) -> Self {
        let shards = shards.max(1);
        let per = capacity.div_ceil(shards);
        ShardedLru {
            shards: (0..shards).map(|_| Mutex::new(Shard::new(per))).collect(),
        }
    }

    #[inline]
    fn shard(&self, key: &K) -> &Mutex<Shard<K, V>> {
        let mut h = IntHasher::default();
        key.hash(&mut h);
        let i = (h.finish() >> 32) as usize % self.shards.len();
        &self.shards[i]
    }

    fn get(&self, key: &K) -> Option<V> {
        self.shard(key).lock().get(key)
    }

    fn insert(&self, key: K, value: V, charge: usize) {
        self.shard(&key).lock().insert(key, value, charge);
    }

    fn remove(&self, key: &K) {
        self.shard(key).lock().remove(key);
    }

    fn usage(&self) -> usize {
        self.shards.iter().map(|s| s.lock().usage).sum()
    }
}

/// Decoded blocks of every table, keyed by (table cache id, block offset), bounded in
/// bytes of block memory.
#[derive(Debug)]
pub struct BlockCache {
    lru: ShardedLru<(u64, u64), Arc<Block>>,
    capacity: usize,
    next_id: AtomicU64,
}

impl BlockCache {
    /// A cache holding at most `capacity_bytes` of blocks.
    pub fn new(capacity_bytes: usize) -> Arc<Self> {
        // Small caches get few shards so that a shard still holds many blocks.
        let shards = (capacity_bytes / (512 << 10)).clamp(1, 16);
        Arc::new(BlockCache {
            lru: ShardedLru::new(capacity_bytes, shards),
            capacity: capacity_bytes,
            next_id: AtomicU64::new(1),
        })
    }

    /// Bytes of blocks held.
    pub fn usage(&self) -> usize {
        self.lru.usage()
    }

    /// The configured bound in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A fresh id for an opened table; blocks are keyed by it so that tables never see
    /// each other's blocks, even across databases sharing one cache.
    pub fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The cached block at `offset` of table `id`.
    #[inline]
    pub fn get(&self, id: u64, offset: u64) -> Option<Arc<Block>> {
        self.lru.get(&(id, offset))
    }

    /// Caches a block.
    pub fn insert(&self, id: u64, offset: u64, block: Arc<Block>) {
        let charge = block.charge();
        self.lru.insert((id, offset), block, charge);
    }
}

/// Open tables, bounded in count; opening reads the footer, index, filter, properties and
/// range tombstones once.
#[derive(Debug)]
pub struct TableCache {
    store: SharedTableStore,
    block_cache: Option<Arc<BlockCache>>,
    lru: ShardedLru<u64, Arc<Table>>,
}

impl TableCache {
    /// A cache of at most `max_open` tables of `store`.
    pub fn new(
        store: SharedTableStore,
        max_open: usize,
        block_cache: Option<Arc<BlockCache>>,
    ) -> Self {
        let max_open = max_open.max(1);
        let shards = (max_open / 32).clamp(1, 8);
        TableCache {
            store,
            block_cache,
            lru: ShardedLru::new(max_open, shards),
        }
    }

    /// The open table `number` of `size` bytes, opening it if needed.
    pub fn get(&self, number: u64, size: u64) -> Result<Arc<Table>> {
        if let Some(t) = self.lru.get(&number) {
            return Ok(t);
        }
        let file = self.store.open_table(number)?;
        let table = Arc::new(Table::open(file, number, size, self.block_cache.clone())?);
        self.lru.insert(number, Arc::clone(&table), 1);
        Ok(table)
    }

    /// Table `number` if it is open (nothing is read).
    pub fn get_open(&self, number: u64) -> Option<Arc<Table>> {
        self.lru.get(&number)
    }

    /// Forgets table `number` (after its file is deleted). Readers still holding it keep
    /// their `Arc`.
    pub fn evict(&self, number: u64) {
        self.lru.remove(&number);
    }

    /// Number of tables held open.
    pub fn open_tables(&self) -> usize {
        self.lru.usage()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recent_and_respects_capacity() {
        let lru: ShardedLru<u64, u64> = ShardedLru::new(3, 1);
        for k in 0..3 {
            lru.insert(k, k * 10, 1);
        }
        assert_eq!(lru.get(&0), Some(0)); // 0 becomes most recent
        lru.insert(3, 30, 1); // evicts 1
        assert_eq!(lru.get(&1), None);
        assert_eq!(lru.get(&0), Some(0));
        assert_eq!(lru.get(&2), Some(20));
        assert_eq!(lru.usage(), 3);
        lru.insert(9, 90, 2); // evicts 3 then 0
        assert_eq!(lru.usage(), 3);
        assert_eq!(lru.get(&3), None);
        assert_eq!(lru.get(&9), Some(90));
        lru.insert(9, 91, 1);
        assert_eq!(lru.get(&9), Some(91));
        lru.remove(&9);
        assert_eq!(lru.get(&9), None);
        lru.insert(5, 5, 4); // larger than the shard: not cached
        assert_eq!(lru.get(&5), None);
    }

    #[test]
    fn random_ops_match_a_model() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(7);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let lru: ShardedLru<u64, u64> = ShardedLru::new(50, 1);
        let mut model: Vec<(u64, u64, usize)> = Vec::new(); // most recent last
        for _ in 0..20_000 {
            let k = rng.gen_range(0..100u64);
            if rng.gen_bool(0.5) {
                let got = lru.get(&k);
                let pos = model.iter().position(|e| e.0 == k);
                assert_eq!(got, pos.map(|p| model[p].1), "seed {seed}");
                if let Some(p) = pos {
                    let e = model.remove(p);
                    model.push(e);
                }
            } else {
                let c = rng.gen_range(1..5usize);
                lru.insert(k, k + 1, c);
                model.retain(|e| e.0 != k);
                model.push((k, k + 1, c));
                while model.iter().map(|e| e.2).sum::<usize>() > 50 {
                    model.remove(0);
                }
            }
            assert_eq!(lru.usage(), model.iter().map(|e| e.2).sum::<usize>());
        }
    }
}
