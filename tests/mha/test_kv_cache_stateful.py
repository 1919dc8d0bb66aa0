"""KVCache as a state machine: random sequences of append (some past
max_len, some of the wrong shape or holding NaN), truncate (some past the
filled part), reset and attend, against a model of the rows it holds.  After
every step: its length and its rows (int8: levels times scales) are the
model's, and a call that raised left the cache as it was."""

import numpy as np
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from conftest import CACHE_ATTEND_TOL, CACHE_STORE_TOL, check_stored, examples
from fastattn import reference
from fastattn.mha import KVCache

B, HKV, HQ, E, EV = 2, 2, 4, 4, 3


class KVCacheMachine(RuleBasedStateMachine):

    @initialize(max_len=st.integers(1, 12), dtype=st.sampled_from(sorted(CACHE_STORE_TOL)),
                seed=st.integers(0, 2**32 - 1))
    def build(self, max_len, dtype, seed):
        self.cache = KVCache(B, HKV, E, max_len, dtype=dtype, value_dim=EV)
        self.max_len, self.dtype = max_len, dtype
        self.rng = np.random.default_rng(seed)
        self.k, self.v = np.zeros((B, HKV, 0, E)), np.zeros((B, HKV, 0, EV))

    def _read(self):
        k, v = self.cache.keys.astype(np.float64), self.cache.values.astype(np.float64)
        if self.dtype == "int8":
            k = k * self.cache.key_scales[..., None]
            v = v * self.cache.value_scales[..., None]
        return k, v

    def _snapshot(self):
        return len(self.cache), [x.copy() for x in self._read()]

    def _unchanged(self, before):
        n, rows = self._snapshot()
        assert n == before[0]
        for a, b in zip(rows, before[1]):
            np.testing.assert_array_equal(a, b)

    def _raises(self, exc, call, why):
        before = self._snapshot()
        try:
            call()
        except exc:
            event(why)
            return self._unchanged(before)
        raise AssertionError(f"{why}: no {exc.__name__}")

    @rule(n=st.integers(0, 5))
    def append(self, n):
        k = self.rng.uniform(-2, 2, (B, HKV, n, E)).astype(np.float32)
        v = self.rng.uniform(-2, 2, (B, HKV, n, EV)).astype(np.float32)
        n0 = len(self.cache)
        if n0 + n > self.max_len:
            return self._raises(ValueError, lambda: self.cache.append(k, v), "append: past max_len")
        self.cache.append(k, v)
        rk, rv = (r[:, :, n0:] for r in self._read())
        check_stored(rk, k, self.dtype)
        check_stored(rv, v, self.dtype)
        self.k = np.concatenate([self.k, rk], axis=2)
        self.v = np.concatenate([self.v, rv], axis=2)

    @rule(what=st.sampled_from(["heads", "value_dim", "value_tokens", "nan"]))
    def append_what_cannot_be_stored(self, what):
        k = self.rng.uniform(-2, 2, (B, HKV, 1, E)).astype(np.float32)
        v = self.rng.uniform(-2, 2, (B, HKV, 1, EV)).astype(np.float32)
        if what == "heads":
            k = k[:, :1]
        elif what == "value_dim":
            v = v[..., :-1]
        elif what == "value_tokens":
            v = np.concatenate([v, v], axis=2)
        elif self.dtype == "int8" and len(self.cache) < self.max_len:
            k[0, 0, 0, 0] = np.nan                  # an int8 cache cannot hold it
        else:
            return
        self._raises(ValueError, lambda: self.cache.append(k, v), f"append: {what}")

    @rule(data=st.data())
    def truncate(self, data):
        n = len(self.cache)
        length = data.draw(st.integers(0, n + 2), label="length")
        if length > n:
            return self._raises(ValueError, lambda: self.cache.truncate(length),
                                "truncate: past the filled part")
        self.cache.truncate(length)
        self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]

    @rule()
    def reset(self):
        self.cache.reset()
        self.k, self.v = self.k[:, :, :0], self.v[:, :, :0]

    @rule(data=st.data())
    def attend(self, data):
        n = len(self.cache)
        if not n:
            return
        nq = data.draw(st.integers(1, n), label="queries")
        q = self.rng.uniform(-1, 1, (B, HQ, nq, E)).astype(np.float32)
        out = self.cache.attend(q)
        assert out.shape == (B, HQ, nq, EV)
        ref = reference.attention(q.astype(np.float64), self.k, self.v, is_causal="lower_right",
                                  enable_gqa=True)
        tol = CACHE_ATTEND_TOL[self.dtype]
        np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=tol, atol=tol)

    @invariant()
    def holds_the_model_s_rows(self):
        assert len(self.cache) == self.k.shape[2]
        k, v = self._read()
        np.testing.assert_array_equal(k, self.k)
        np.testing.assert_array_equal(v, self.v)


TestKVCacheMachine = KVCacheMachine.TestCase
TestKVCacheMachine.settings = settings(max_examples=examples(100), stateful_step_count=30)
