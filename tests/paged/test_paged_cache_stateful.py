"""PagedKVCache as a state machine: random sequences of add, append (per
layer, some of them too long for the free blocks or of the wrong shape),
fork, free and attend, against a model that keeps each sequence's rows per
layer.  After every step: each sequence reads back exactly its own rows from
the pools, the free count is the pool less the blocks held, a block shared by
two sequences is full in every layer of each (so no append can write into
it), and a call that raised left the pools, tables and lengths as they were."""

import numpy as np
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import fastattn
from conftest import CACHE_ATTEND_TOL, CACHE_STORE_TOL, check_stored, examples
from fastattn import reference
from paged_common import gather

HQ, HKV, E, EV, LAYERS = 4, 2, 4, 3, 2


class PagedCacheMachine(RuleBasedStateMachine):

    @initialize(num_blocks=st.integers(2, 8), block_size=st.sampled_from([1, 2, 3, 5]),
                dtype=st.sampled_from(sorted(CACHE_STORE_TOL)),
                layout=st.sampled_from(["NHD", "HND"]),
                seed=st.integers(0, 2**32 - 1))
    def build(self, num_blocks, block_size, dtype, layout, seed):
        self.cache = fastattn.PagedKVCache(num_blocks, block_size, HKV, E, num_layers=LAYERS,
                                           dtype=dtype, value_dim=EV, layout=layout)
        self.num_blocks, self.bs, self.dtype, self.layout = num_blocks, block_size, dtype, layout
        self.rng = np.random.default_rng(seed)
        # sequence id -> per layer [keys (n, HKV, E), values (n, HKV, EV)], float64
        self.model = {}
        self.freed = []
        self.add()

    # -- helpers -----------------------------------------------------------
    def _blocks(self, sid):
        n = max(self.cache.length(sid, layer) for layer in range(LAYERS))
        return self.cache.block_table([sid])[0, :-(-n // self.bs)].tolist()

    def _read(self, sid, layer):
        table, n = self.cache.block_table([sid])[0], self.cache.length(sid, layer)
        sk, sv = self.cache.scales(layer) or (None, None)
        return (gather(self.cache.key_cache(layer), table, n, self.layout, sk),
                gather(self.cache.value_cache(layer), table, n, self.layout, sv))

    def _snapshot(self):
        ids = sorted(self.model)
        pools = [p.copy() for layer in range(LAYERS)
                 for p in [self.cache.key_cache(layer), self.cache.value_cache(layer)] +
                 list(self.cache.scales(layer) or ())]
        return (self.cache.num_free_blocks, self.cache.block_table(ids).tolist() if ids else [],
                [self.cache.seq_lens(ids, layer).tolist() for layer in range(LAYERS)], pools)

    def _unchanged(self, before):
        after = self._snapshot()
        assert before[:3] == after[:3]
        for a, b in zip(before[3], after[3]):
            np.testing.assert_array_equal(a, b)

    def _rows(self, n, width):
        return self.rng.uniform(-2, 2, (n, HKV, width)).astype(np.float32)

    def _pick(self, data):
        return data.draw(st.sampled_from(sorted(self.model)), label="sequence")

    # -- rules ---------------------------------------------------------------
    @rule()
    def add(self):
        sid = self.cache.add()
        assert sid not in self.model and sid not in self.freed
        self.model[sid] = [[np.zeros((0, HKV, E)), np.zeros((0, HKV, EV))] for _ in range(LAYERS)]

    def _append(self, sid, layer, n):
        k, v = self._rows(n, E), self._rows(n, EV)
        have = len(self._blocks(sid))
        need = max(0, -(-(self.cache.length(sid, layer) + n) // self.bs) - have)
        before = self._snapshot()
        if need > self.cache.num_free_blocks:
            try:
                self.cache.append(sid, k, v, layer=layer)
            except MemoryError:
                event("append: out of blocks")
                return self._unchanged(before)
            raise AssertionError(f"appending {n} rows needing {need} blocks did not raise")
        self.cache.append(sid, k, v, layer=layer)
        n0 = self.model[sid][layer][0].shape[0]
        rk, rv = (r[n0:] for r in self._read(sid, layer))
        check_stored(rk, k, self.dtype)
        check_stored(rv, v, self.dtype)
        self.model[sid][layer] = [np.concatenate([m, r]) for m, r in
                                  zip(self.model[sid][layer], (rk, rv))]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), layer=st.integers(0, LAYERS - 1), n=st.integers(1, 7))
    def append(self, data, layer, n):
        self._append(self._pick(data), layer, n)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), n=st.integers(1, 4))
    def append_to_every_layer(self, data, n):
        """A model's step: the same number of rows to each layer in turn."""
        sid = self._pick(data)
        for layer in range(LAYERS):
            self._append(sid, layer, n)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), what=st.sampled_from(["key_heads", "key_dim", "value_rows"]))
    def append_the_wrong_shape(self, data, what):
        sid = self._pick(data)
        k, v = self._rows(2, E), self._rows(2, EV)
        if what == "key_heads":
            k = k[:, :1]
        elif what == "key_dim":
            k = k[..., :-1]
        else:
            v = v[:1]
        before = self._snapshot()
        try:
            self.cache.append(sid, k, v)
        except ValueError:
            return self._unchanged(before)
        raise AssertionError(f"append of key {k.shape}, value {v.shape} did not raise")

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def fork(self, data):
        sid = self._pick(data)
        lengths = {self.cache.length(sid, layer) for layer in range(LAYERS)}
        before = self._snapshot()
        if len(lengths) != 1:
            try:
                self.cache.fork(sid)
            except ValueError:
                event("fork: lengths differ per layer")
                return self._unchanged(before)
            raise AssertionError(f"fork of a sequence of lengths {lengths} per layer did not raise")
        if lengths.pop() % self.bs and self.cache.num_free_blocks == 0:
            try:
                self.cache.fork(sid)
            except MemoryError:
                event("fork: out of blocks")
                return self._unchanged(before)
            raise AssertionError("fork needing a block with none free did not raise")
        child = self.cache.fork(sid)
        shares = self.model[sid][0][0].shape[0] >= self.bs
        event("fork: shares a block" if shares else "fork: no full block")
        assert child not in self.model
        self.model[child] = [[m.copy() for m in layer] for layer in self.model[sid]]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free(self, data):
        sid = self._pick(data)
        self.cache.free(sid)
        del self.model[sid]
        self.freed.append(sid)

    @precondition(lambda self: self.freed)
    @rule(data=st.data())
    def a_freed_sequence_is_unknown(self, data):
        sid = data.draw(st.sampled_from(self.freed), label="freed")
        before = self._snapshot()
        for call in (lambda: self.cache.append(sid, self._rows(1, E), self._rows(1, EV)),
                     lambda: self.cache.fork(sid), lambda: self.cache.free(sid)):
            try:
                call()
            except KeyError:
                continue
            raise AssertionError(f"sequence {sid} was freed, yet a call on it did not raise")
        self._unchanged(before)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), layer=st.integers(0, LAYERS - 1))
    def attend(self, data, layer):
        live = [s for s in sorted(self.model) if self.model[s][layer][0].shape[0]]
        if not live:
            return
        ids = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=4), label="batch")
        q = self.rng.uniform(-1, 1, (len(ids), HQ, E)).astype(np.float32)
        out = self.cache.attend(q, ids, layer=layer)
        assert out.shape == (len(ids), HQ, EV) and out.dtype == np.float32
        for b, sid in enumerate(ids):
            k, v = self.model[sid][layer]
            ref = reference.attention(q[b].astype(np.float64)[:, None, :], k.swapaxes(0, 1),
                                      v.swapaxes(0, 1), enable_gqa=True)[:, 0]
            np.testing.assert_allclose(out[b], ref, rtol=CACHE_ATTEND_TOL[self.dtype],
                                       atol=CACHE_ATTEND_TOL[self.dtype])

    # -- invariants ----------------------------------------------------------
    @invariant()
    def every_sequence_reads_back_its_own_rows(self):
        for sid, layers in self.model.items():
            for layer, (k, v) in enumerate(layers):
                assert self.cache.length(sid, layer) == k.shape[0]
                rk, rv = self._read(sid, layer)
                np.testing.assert_array_equal(rk, k)
                np.testing.assert_array_equal(rv, v)

    @invariant()
    def blocks_are_held_once_per_sequence_and_shared_only_when_full(self):
        holders = {}
        for sid in self.model:
            blocks = self._blocks(sid)
            assert len(set(blocks)) == len(blocks)
            assert all(0 <= b < self.num_blocks for b in blocks)
            full = min(self.cache.length(sid, layer) for layer in range(LAYERS)) // self.bs
            for i, b in enumerate(blocks):
                holders.setdefault(b, []).append(i < full)
        assert self.cache.num_free_blocks == self.num_blocks - len(holders)
        for b, full in holders.items():
            assert len(full) == 1 or all(full), f"block {b} is shared but not full"


TestPagedCacheMachine = PagedCacheMachine.TestCase
TestPagedCacheMachine.settings = settings(max_examples=examples(100), stateful_step_count=30)
