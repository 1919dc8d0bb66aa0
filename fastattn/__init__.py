"""fastattn: scaled dot-product attention on the CPU, fast, for NumPy arrays.

The public names; see :func:`attention`, :func:`attention_backward`, :func:`softmax`,
:func:`attention_varlen`, :func:`attention_varlen_backward`, :func:`merge_attention`,
:func:`multi_head_attention`, :class:`KVCache`, :func:`attention_paged`, :func:`paged_append`,
:class:`PagedKVCache`, :func:`trace` and :func:`show_config`.
"""

from ._api import attention
from .backward import attention_backward
from ._softmax import softmax
from .merge import merge_attention
from .varlen import attention_varlen
from .varlen_backward import attention_varlen_backward
from .mha import KVCache, multi_head_attention
from .paged import attention_paged, paged_append
from .paged_cache import PagedKVCache
from .trace import trace
from . import _config
from ._config import available_isas, get_isa, openmp_enabled, set_isa, show_config
from ._version import __version__

_config.init_threads()

__all__ = [
    "attention",
    "attention_backward",
    "softmax",
    "attention_varlen",
    "attention_varlen_backward",
    "merge_attention",
    "multi_head_attention",
    "KVCache",
    "attention_paged",
    "paged_append",
    "PagedKVCache",
    "trace",
    "get_isa",
    "set_isa",
    "available_isas",
    "openmp_enabled",
    "show_config",
    "__version__",
]
