"""``model.generate_batch`` (transformers' continuous batching) with
attn_implementation="fastattn": greedy tokens equal to sdpa's (paged|eager's
for Gemma 2, which has no sdpa path) for tiny random Llama, Qwen2 (one
sliding layer), Mistral (sliding window shorter than the prompts) and Gemma 2
(softcap + window), with prefill chunks mixed with decodes in one step, and
the paged cache read in place by fastattn.attention_paged (never gathered), its
block tables built once per step and rebuilt when the batch changes."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the transformers backend needs torch")
transformers = pytest.importorskip("transformers", reason="continuous batching needs "
                                   "transformers (pip install 'fastattn[torch]')")

from fastattn.integrations import transformers as fa_tf  # noqa: E402
from fastattn.integrations import transformers_cb  # noqa: E402
from models_common import tiny_model  # noqa: E402

fa_tf.register()
if not transformers_cb.install(fa_tf.NAME):
    pytest.skip(f"this transformers ({transformers.__version__}) has no continuous batching of "
                f"the form fastattn's glue is written for", allow_module_level=True)

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
WINDOW = 8  # shorter than the prompts
PAGE = 16
# a prompt shorter than a page, one of exactly two pages, longer ones, and a
# repeat (whose full blocks transformers may share with the first)
LENGTHS = (5, 40, 32, 70, 40)
NEW = 8


def _model(name):
    return tiny_model(name, COMMON, WINDOW, extra={"gemma2": {"head_dim": 16}}).eval()


def _prompts():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, COMMON["vocab_size"], (n,), generator=g).tolist()
               for n in LENGTHS[:-1]]
    return prompts + [list(prompts[1])]


def _generate_batch(model, impl):
    """Greedy tokens per request; steps of at most 32 tokens, so the long
    prompts are prefilled in chunks next to the others' decoding steps."""
    model.set_attn_implementation(impl)
    gen = transformers.GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=-1,
                                        pad_token_id=0)
    batching = transformers.ContinuousBatchingConfig(page_size=PAGE, num_blocks=64,
                                                     max_batch_tokens=32)
    out = model.generate_batch(_prompts(), generation_config=gen,
                               continuous_batching_config=batching, warmup=False)
    return [out[k].generated_tokens for k in sorted(out)]


class _Calls:
    """Counts the calls of a function of transformers_cb and keeps each one's
    query lengths."""

    def __init__(self, monkeypatch, attr, cu_arg):
        self.query_lengths = []
        fn = getattr(transformers_cb, attr)

        def counted(*args, **kwargs):
            cu = kwargs.get("cu_seqlens_q") if cu_arg is None else args[cu_arg]
            cu = [int(x) for x in cu]
            self.query_lengths.append([b - a for a, b in zip(cu, cu[1:])])
            return fn(*args, **kwargs)
        monkeypatch.setattr(transformers_cb, attr, counted)

    def mixed(self) -> bool:
        """Whether one call had a decoding step and a prefill chunk."""
        return any(1 in n and max(n) > 1 for n in self.query_lengths)


def _full_layer_reads(monkeypatch) -> list:
    """The number of cached rows each full-attention layer's cache update
    gathers (index_select), call by call."""
    from transformers.generation.continuous_batching.cache_allocators import full_attention
    cls = full_attention.FullAttentionCacheAllocator
    reads, update = [], cls.update

    def counted(self, key_states, value_states, layer_idx, read_index, write_index):
        reads.append(read_index.numel())
        return update(self, key_states, value_states, layer_idx, read_index, write_index)
    monkeypatch.setattr(cls, "update", counted)
    return reads


@pytest.mark.parametrize("name, reference, paged", [
    ("llama", "sdpa", True), ("qwen2", "sdpa", True), ("mistral", "sdpa", False),
    ("gemma2", "paged|eager", True)])
def test_generate_batch_greedy_tokens_match_with_prefill_chunks_mixed_with_decodes(
        monkeypatch, name, reference, paged):
    model = _model(name)
    pages = _Calls(monkeypatch, "_attention_paged", None)
    packed = _Calls(monkeypatch, "_attention_varlen", 3)
    tables = []
    monkeypatch.setattr(transformers_cb, "_tables",
                        lambda *a, f=transformers_cb._tables: tables.append(1) or f(*a))
    gathered = _full_layer_reads(monkeypatch)
    got = _generate_batch(model, "fastattn")
    fastattn_gathered, gathered[:] = list(gathered), []
    assert len(got) == len(LENGTHS) and all(len(t) == NEW for t in got)
    # full-attention layers read the cache's pages; sliding ones (ring
    # buffers) the gathered window
    assert bool(pages.query_lengths) == paged
    # a step's block tables are built once, by its first full-attention layer
    full = [t for t in getattr(model.config, "layer_types", None)
            or ["full_attention"] * model.config.num_hidden_layers if t == "full_attention"]
    assert len(pages.query_lengths) == len(tables) * len(full)
    assert pages.mixed() or packed.mixed()
    if name != "llama":
        assert packed.query_lengths
    n_pages, n_packed = len(pages.query_lengths), len(packed.query_lengths)
    assert _generate_batch(model, reference) == got
    # full-attention layers' caches are never gathered for fastattn (they are
    # for the reference: the count sees gathers)
    assert not any(fastattn_gathered)
    assert bool(fastattn_gathered) == bool(any(gathered)) == paged   # mistral: no full layer
    # the reference implementation ran without fastattn
    assert (len(pages.query_lengths), len(packed.query_lengths)) == (n_pages, n_packed)


class _Allocator:
    """The parts of a full-attention (or sliding) cache allocator the glue reads."""

    def __init__(self, page, blocks=8, heads=2, dim=4, block_table=True):
        self.index, self.supports_block_table = 0, block_table
        self.pages = (torch.zeros(blocks, page, heads, dim), torch.zeros(blocks, page, heads, dim))

    def get_cache_for_block_table(self, layer_idx):
        return self.pages


class _Cache:
    pass


def _batch(lens, blocks, page):
    """A batch's read indices (each sequence's slots in order, over its
    blocks), cu_seq_lens_k and cu_seq_lens_q (one query each)."""
    read = torch.cat([torch.tensor(b)[torch.arange(n) // page] * page + torch.arange(n) % page
                      for n, b in zip(lens, blocks)])
    cu_k = torch.tensor([0] + list(lens)).cumsum(0).to(torch.int32)
    return read, cu_k, torch.arange(len(lens) + 1, dtype=torch.int32)


def test_step_block_tables_are_each_sequences_blocks_in_order():
    page = 4
    read, cu_k, cu_q = _batch([9, 3], [[5, 2, 7], [1]], page)
    step = transformers_cb._step(_Cache(), _Allocator(page), 0, read, cu_k, cu_q)
    assert step.lens.tolist() == [9, 3] and step.cu_q.tolist() == [0, 1, 2] and step.nq == 2
    assert step.table[0].tolist() == [5, 2, 7] and step.table[1, 0] == 1
    assert step.table.dtype == step.lens.dtype == step.cu_q.dtype == np.int64


def test_step_metadata_is_kept_for_the_same_batch_and_rebuilt_when_it_changes():
    page, cache, alloc = 4, _Cache(), _Allocator(4)
    read, cu_k, cu_q = _batch([9, 3], [[5, 2, 7], [1]], page)
    first = transformers_cb._step(cache, alloc, 0, read, cu_k, cu_q)
    assert transformers_cb._step(cache, alloc, 1, read, cu_k, cu_q) is first  # the next layer
    # the next step: one sequence grew by a token into a new block, the other finished
    read2, cu_k2, cu_q2 = _batch([10], [[5, 2, 6]], page)
    second = transformers_cb._step(cache, alloc, 0, read2, cu_k2, cu_q2)
    assert second is not first
    assert second.lens.tolist() == [10] and second.table.tolist() == [[5, 2, 6]]
    # equal contents in new tensors are a new batch too: never a stale table
    third = transformers_cb._step(cache, alloc, 0, read2.clone(), cu_k2, cu_q2)
    assert third is not second and third.table.tolist() == [[5, 2, 6]]
    assert first.table[0].tolist() == [5, 2, 7]            # an earlier step's left as it was


def test_step_is_none_where_the_pages_cannot_be_read_in_place():
    read, cu_k, cu_q = _batch([9, 3], [[5, 2, 7], [1]], 4)
    sliding = _Allocator(4, block_table=False)
    assert transformers_cb._step(_Cache(), sliding, 0, read, cu_k, cu_q) is None
    nothing_cached = torch.zeros(0, dtype=torch.int64)
    assert transformers_cb._step(_Cache(), _Allocator(4), 0, nothing_cached, cu_k, cu_q) is None
    assert transformers_cb._step(_Cache(), _Allocator(4), 0, read[:-1], cu_k, cu_q) is None


def test_register_again_wraps_the_cache_once():
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    update = PagedAttentionCache.update
    fa_tf.register()
    assert PagedAttentionCache.update is update
    assert not getattr(update._fastattn_wrapped, "_fastattn", False)


def test_generate_batch_still_refuses_an_unregistered_custom_name():
    model = _model("llama")
    transformers.AttentionInterface.register("not_fastattn", fa_tf.attention_forward)
    model.set_attn_implementation("not_fastattn")
    gen = transformers.GenerationConfig(max_new_tokens=2, do_sample=False, eos_token_id=-1)
    with pytest.raises(ValueError, match="not supported for continuous batching"):
        model.generate_batch([[5, 6, 7]], generation_config=gen, warmup=False)


def test_examples_of_the_glue_run_as_written():
    import doctest
    result = doctest.testmod(transformers_cb, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
