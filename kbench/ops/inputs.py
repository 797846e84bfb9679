"""Inputs from a counter-based generator: made where the kernel runs, recomputable element by element.

Every float input of a case is drawn from **Philox4x64-10** (Salmon et al., "Parallel random numbers:
as easy as 1, 2, 3", SC 2011; NumPy's ``numpy.random.Philox`` is the same function) keyed by a 128-bit
input key the judge derives from the run's secret. Element ``e`` of input number ``t`` is

    word  = philox(counter=(e // 16 + 1, t, 0, 0), key)[(e // 4) % 4]      # 64 random bits
    lane  = (word >> (16 * (e % 4))) & 0xFFFF                                # one of its four 16-bit lanes
    value = table[lane]                                                      # 65,536 values of the input's dtype

so any element can be recomputed without the others (the judge regenerates only the rows it checks, a
device generates a whole tensor in one pass), and the same key gives the same bytes on every machine and
every device: the CPU device draws with NumPy, the CUDA device with a kernel running the same function
(``kbench_cuda``; a test compiles that kernel's source as host C++ and compares it with NumPy's).

``table`` is a :class:`ValueTable`: entry ``i`` is the lane read as a signed 16-bit integer times
``1 / 18918.6`` in float32 (a uniform distribution of mean 0 and variance 1 on [-1.73, 1.73]), optionally
divided (FP8 inputs are stored as value / descale), then rounded to the input's dtype. Every entry is
one IEEE operation or two from its lane, so the host computes it from the lane directly (no gather: about
1 ns per element with NumPy, against 3.5 with a table lookup) and a device may gather it from the table:
both give the same bytes. Attention scores ``q . k / sqrt(d)`` are sums of ``d`` such products, close to
normal whatever the inputs' own distribution.

Structural inputs (page tables, sequence offsets) are small and made on the host by the op from a NumPy
generator seeded by the same key (:attr:`InputSpec.host`).
"""
from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

import numpy as np

#: 16-bit lanes: the size of every value table
TABLE_SIZE = 1 << 16
#: elements drawn from one Philox block (four 64-bit words of four 16-bit lanes)
ELEMENTS_PER_BLOCK = 16

_MASK64 = (1 << 64) - 1


def input_key(seed: Any) -> tuple[int, int]:
    """A 128-bit input key as two 64-bit words, from a key pair, bytes or any integer seed."""
    if isinstance(seed, tuple) and len(seed) == 2:
        return int(seed[0]) & _MASK64, int(seed[1]) & _MASK64
    if isinstance(seed, (bytes, bytearray)):
        raw = bytes(seed[:16]).ljust(16, b"\0")
        return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
    seed = int(seed)
    if 0 <= seed <= _MASK64:
        return seed, 0
    digest = hashlib.blake2b(str(seed).encode(), digest_size=16).digest()
    return input_key(digest)


# --------------------------------------------------------------------------------------------
# value tables


#: one lane as a signed 16-bit integer times this is uniform with variance 1 (65536 / sqrt(12) = 18918.6)
UNIT_SCALE = float(np.float32(1.0 / 18918.6))


def np_dtype(name: str | np.dtype) -> np.dtype:
    """A NumPy dtype by name, bfloat16 and float8 from ml_dtypes."""
    if isinstance(name, np.dtype):
        return name
    if name in ("bfloat16", "float8_e4m3fn"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class ValueTable:
    """The 65,536 values an input's elements take, in the input's dtype: entry ``i`` is ``values_of(i)``.

    ``divide`` divides the float32 values before the cast to ``dtype`` (FP8 inputs are stored as
    value / descale).
    """

    dtype: str                      # numpy dtype name ("float32", "bfloat16", "float8_e4m3fn", ...)
    divide: float = 1.0
    #: multiplies the float32 values before the divide and the cast (a value range's std, a power of two: exact)
    scale: float = 1.0

    @property
    def name(self) -> str:
        extra = "" if self.divide == 1.0 else f",divide={self.divide!r}"
        extra += "" if self.scale == 1.0 else f",scale={self.scale!r}"
        return f"uniform[{self.dtype}{extra}]"

    def float32_of(self, lanes: np.ndarray) -> np.ndarray:
        """The float32 values of 16-bit ``lanes`` before the cast to the dtype."""
        x = lanes.view(np.int16).astype(np.float32)
        np.multiply(x, np.float32(UNIT_SCALE), out=x)
        if self.scale != 1.0:
            np.multiply(x, np.float32(self.scale), out=x)
        if self.divide != 1.0:
            np.divide(x, np.float32(self.divide), out=x)
        return x

    def values_of(self, lanes: np.ndarray, out: np.ndarray | None = None,
                  pattern: Pattern | None = None, start: int = 0) -> np.ndarray:
        """The values of 16-bit ``lanes`` (uint16), elementwise: the table's definition, and the host's way
        of drawing (written into ``out`` when given, of the dtype). ``pattern``: the position-dependent part of
        a value range, for the elements numbered from ``start``."""
        x = self.float32_of(lanes)
        if pattern is not None:
            pattern.apply(x, start)
        dtype = np_dtype(self.dtype)
        if out is None:
            return x.astype(dtype)
        if dtype == np.float32:
            np.copyto(out, x)
        else:
            out[...] = x.astype(dtype)
        return out

    def values(self) -> np.ndarray:
        return _table_values(self)

    def bits(self) -> np.ndarray:
        """The table as unsigned integers of the dtype's width (what a device gathers from)."""
        values = self.values()
        return values.view(_UINT[values.dtype.itemsize])


@lru_cache(maxsize=64)
def _table_values(table: ValueTable) -> np.ndarray:
    out = table.values_of(np.arange(TABLE_SIZE, dtype=np.uint32).astype(np.uint16))
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class Pattern:
    """The position-dependent part of a value range: the float32 values of chosen elements multiplied by
    ``factor`` (0 zeroes them) before the cast. ``axis`` ``"channel"`` chooses the elements whose last index
    ``c`` (head_dim) has ``c % every == offset``; ``"token"`` the whole vectors (every head of one token row:
    ``inner`` elements, the product of the last two dimensions) whose row number ``r`` has
    ``r % every == offset``. Element positions are flat C-order indices, so any range of elements is computed
    without the others, as the generator's values are."""

    axis: str                      # "channel" or "token"
    every: int
    offset: int
    factor: float
    inner: int                     # elements per token row (heads x head_dim)
    head_dim: int

    def chosen(self, start: int, stop: int) -> np.ndarray:
        idx = np.arange(start, stop, dtype=np.int64)
        where = idx % self.head_dim if self.axis == "channel" else idx // self.inner
        return where % self.every == self.offset

    def apply(self, x: np.ndarray, start: int) -> None:
        """Multiply, in place, the chosen elements of ``x`` (float32, elements ``start`` on)."""
        sel = self.chosen(start, start + x.size)
        x[sel] *= np.float32(self.factor)


def _on_host(rng: np.random.Generator) -> np.ndarray:  # pragma: no cover - never called
    raise AssertionError("a patterned input is drawn by kbench.ops.inputs.generate, not by its host hook")


@dataclass(frozen=True)
class InputSpec:
    """One input of a case: drawn from ``table`` by the counter-based generator, or made on the host by
    ``host(rng)`` (small structural arrays: offsets, page tables).

    ``pattern`` (a value range's position-dependent part): drawn from ``table`` and changed by position on the
    host; such a spec also carries ``host`` (a marker), which tells a device that gathers from the table on its
    own (``kbench_cuda``) to draw it on the host instead (its ``generate`` falls back to the host for any spec
    with ``host``)."""

    shape: tuple[int, ...]
    dtype: str
    table: ValueTable | None = None
    host: Callable[[np.random.Generator], np.ndarray] | None = None
    pattern: Pattern | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np_dtype(self.dtype).itemsize


def unit_variance(shape: tuple[int, ...], dtype: str, *, divide: float = 1.0) -> InputSpec:
    """A random input of mean 0 and variance 1 (divided by ``divide`` before the cast, see :class:`ValueTable`)."""
    return InputSpec(tuple(int(n) for n in shape), dtype, ValueTable(dtype, divide))


def structural(shape: tuple[int, ...], dtype: str, make: Callable[[np.random.Generator], np.ndarray]) -> InputSpec:
    return InputSpec(tuple(int(n) for n in shape), dtype, host=make)


# --------------------------------------------------------------------------------------------
# value ranges: what the inputs' values look like (a case's ``values`` parameter)


#: the value range of a case that does not name one: today's inputs (mean 0, variance 1), its id and keys unchanged
DEFAULT_VALUES = "unit"


@dataclass(frozen=True)
class ValueRange:
    """How a case's q, k and v depart from unit variance (docs/fuzz.md, "Value ranges").

    ``scale``: per role (q, k, v) a factor of every element (a power of two: exact, kept in the value table so a
    device draws it itself); ``patterns``: per role the position-dependent part (:class:`Pattern` minus the
    shape), as ``(axis, every, offset, factor)``. Other inputs (a backward's ``do``, structural ones) are left as
    they are."""

    name: str
    scale: Mapping[str, float]
    patterns: Mapping[str, tuple[str, int, int, float]]
    description: str

    def __hash__(self) -> int:
        return hash(self.name)

    def factor(self, role: str) -> float:
        """The largest factor any element of input ``role`` gets (at least 1)."""
        pattern = self.patterns.get(role)
        return max(1.0, self.scale.get(role, 1.0) * max(1.0, pattern[3] if pattern else 1.0))

    @property
    def score_scale(self) -> float:
        """How many times larger than unit inputs' the largest scores get: softmax's sensitivity to an error in a
        score grows with the score, so an honest kernel's error (a float32 accumulation of ``q . k``) grows with it."""
        return self.factor("q") * self.factor("k")

    @property
    def gentle(self) -> bool:
        """Whether the scores stay those of unit inputs or smaller (the backward is drawn only with these)."""
        return self.score_scale <= 1.0


def _range(name: str, description: str, scale: Mapping[str, float] | None = None,
           patterns: Mapping[str, tuple[str, int, int, float]] | None = None) -> ValueRange:
    return ValueRange(name, dict(scale or {}), dict(patterns or {}), description)


#: the named value ranges (``std:S`` is the family of plain scales); each reference is the float64 attention of the
#: drawn inputs (exact: tests/test_fuzz_values.py), each bound the case's dtype bound
VALUE_RANGES: dict[str, ValueRange] = {r.name: r for r in (
    _range("unit", "mean 0, variance 1 (uniform on [-1.73, 1.73]): scores of std 1"),
    _range("large_scores", "q and k 16x (std 16): scores of std 256, far past where exp overflows without the "
           "row max subtracted (fp16 at 11, fp32/bf16 at 88) and Q K^T before scaling within a factor of "
           "about 3 of fp16's largest value (65,504) at head_dim 256",
           scale={"q": 16.0, "k": 16.0}),
    _range("outlier_channels", "q, k and v 8x on the channels c % 16 == 3 (every head): a few channels "
           "dominate the scores and the output, as in LLM activations",
           patterns={n: ("channel", 16, 3, 8.0) for n in ("q", "k", "v")}),
    _range("outlier_tokens", "k and v 16x on the token rows r % 61 == 0 (the first, an attention sink, and "
           "every 61st): a few keys take most of the weight and carry large values",
           patterns={n: ("token", 61, 0, 16.0) for n in ("k", "v")}),
    _range("constant_rows", "q zero on the token rows r % 3 == 1: those score rows are constant, their output "
           "the mean of the values the row sees (a closed form)",
           patterns={"q": ("token", 3, 1, 0.0)}),
    _range("one_hot", "k 32x on the token rows r % 16 == 5: a row that sees such a key puts all but about "
           "1e-10 of its weight on one key, the others as good as masked",
           patterns={"k": ("token", 16, 5, 32.0)}),
)}
#: the range of ``std:S`` (S a power of two, so the scaling is exact)
STD_RANGE = (2.0 ** -6, 2.0 ** 4)
#: which role each input name plays (a paged cache's pools are k and v)
ROLES = {"q": "q", "k": "k", "v": "v", "k_pages": "k", "v_pages": "v"}


def value_range(name: Any) -> ValueRange:
    """The value range called ``name`` (one of :data:`VALUE_RANGES` or ``std:S``); ValueError says what is known."""
    text = str(name).strip()
    if text in VALUE_RANGES:
        return VALUE_RANGES[text]
    if text.startswith("std:"):
        try:
            s = float(text[4:])
        except ValueError:
            s = float("nan")
        lo, hi = STD_RANGE
        if not (lo <= s <= hi) or math.frexp(s)[0] != 0.5:
            raise ValueError(f"value range {text!r}: S of std:S must be a power of two from {lo:g} to {hi:g} "
                             f"(an exact scaling), e.g. std:4 or std:0.25")
        if s == 1.0:
            return VALUE_RANGES[DEFAULT_VALUES]
        return _range(f"std:{s:g}", f"q, k and v of std {s:g}", scale={n: s for n in ("q", "k", "v")})
    raise ValueError(f"unknown value range {text!r}; known: {', '.join(VALUE_RANGES)}, std:S (S a power of two "
                     f"from {STD_RANGE[0]:g} to {STD_RANGE[1]:g})")


#: the relative L2 bound that a float32 accumulation of unit-scale scores keeps (DType fp32's)
SCORE_BOUND = 1e-5


def values_bound(case: Any, bound: float) -> float:
    """The bound of a case's output given its dtype's ``bound``: the same, or ``SCORE_BOUND`` times the value range's
    score scale when that is larger (``large_scores``: 2.56e-3 for fp32 and fp16, bf16's 1e-2 unchanged)."""
    values = values_of(case)
    if values == DEFAULT_VALUES:
        return bound
    return max(bound, SCORE_BOUND * value_range(values).score_scale)


def values_of(case: Any) -> str:
    """A case's value range name (``unit`` when it names none)."""
    params = getattr(case, "params", case)
    return str(params.get("values", DEFAULT_VALUES))


def with_values(specs: dict[str, InputSpec], values: str, head_dim: int) -> dict[str, InputSpec]:
    """``specs`` (unit variance) drawn from the value range ``values`` instead; ``unit`` returns them unchanged."""
    if values == DEFAULT_VALUES:
        return specs
    vr = value_range(values)
    out = dict(specs)
    for name, spec in specs.items():
        role = ROLES.get(name)
        if role is None or spec.table is None:
            continue
        table = spec.table
        if role in vr.scale:
            table = ValueTable(table.dtype, table.divide, table.scale * vr.scale[role])
        pattern = None
        if role in vr.patterns:
            axis, every, offset, factor = vr.patterns[role]
            pattern = Pattern(axis, every, offset, factor, inner=math.prod(spec.shape[-2:]), head_dim=head_dim)
        out[name] = InputSpec(spec.shape, spec.dtype, table, _on_host if pattern else None, pattern)
    return out


# --------------------------------------------------------------------------------------------
# the generator (host side)


_GENERATOR = threading.local()


def _words(key: tuple[int, int], stream: int, first_block: int, blocks: int) -> np.ndarray:
    """``4 * blocks`` Philox words starting at block ``first_block`` of input ``stream``.

    One generator per thread, its state set for each request (NumPy's constructor draws OS entropy for a
    seed sequence it does not need here, ~100 us; setting the state costs ~10 us).
    """
    gen = getattr(_GENERATOR, "philox", None)
    if gen is None:
        gen = _GENERATOR.philox = np.random.Philox(key=np.zeros(2, dtype=np.uint64))
    gen.state = {"bit_generator": "Philox",
                 "state": {"counter": np.array([first_block, stream, 0, 0], dtype=np.uint64),
                           "key": np.array(key, dtype=np.uint64)},
                 "buffer": np.zeros(4, dtype=np.uint64), "buffer_pos": 4, "has_uint32": 0, "uinteger": 0}
    return gen.random_raw(4 * blocks)


def lanes(key: tuple[int, int], stream: int, start: int, stop: int) -> np.ndarray:
    """The 16-bit table indices of elements [start, stop) of input ``stream``."""
    if stop <= start:
        return np.empty(0, dtype=np.uint16)
    first, last = start // ELEMENTS_PER_BLOCK, (stop - 1) // ELEMENTS_PER_BLOCK
    words = _words(key, stream, first, last - first + 1)
    offset = start - first * ELEMENTS_PER_BLOCK
    return words.view(np.uint16)[offset:offset + (stop - start)]


def stream_seed(key: tuple[int, int], stream: int) -> int:
    """The NumPy seed of a structural input (a different stream of the same key)."""
    return int.from_bytes(hashlib.blake2b(f"{key[0]}:{key[1]}:{stream}".encode(), digest_size=8).digest(), "little")


class HostInputCache:
    """Whole table-drawn inputs made on the host, by what decides their content (key, stream, shape, table),
    the least recently used dropped first to stay within ``max_bytes``.

    The backends of a case get the same input keys (a key is the run's secret, the case, a purpose and a
    counter, never the backend), so the judge regenerating a checked call's inputs, and a trusted worker
    filling a slot or checking that a call left its inputs alone, would draw the same tensors once per
    backend. Drawing them costs as much as a small kernel call on the CPU; a copy costs a tenth of it.
    Cached arrays are read-only. A worker running an untrusted kernel turns its cache off (the kernel runs
    in that process and could rewrite a cached copy along with the input it changed; regeneration from the
    key is what it cannot reach). The limit holds whatever the cases: an input larger than a quarter of it is
    never kept."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.enabled = int(max_bytes), True
        self._items: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.bytes = self.hits = self.misses = 0
        self._lock = threading.Lock()  # a run on several devices judges in several threads of one process

    @staticmethod
    def ident(spec: InputSpec, key: tuple[int, int], stream: int) -> tuple:
        return (int(key[0]), int(key[1]), int(stream), spec.shape, spec.dtype, spec.table, spec.pattern)

    def get(self, ident: tuple) -> np.ndarray | None:
        if not self.enabled:
            return None
        with self._lock:
            array = self._items.get(ident)
            if array is None:
                self.misses += 1
                return None
            self._items.move_to_end(ident)
            self.hits += 1
            return array

    def put(self, ident: tuple, array: np.ndarray) -> None:
        if not self.enabled or array.nbytes > self.max_bytes // 4 or ident in self._items:
            return
        kept = np.array(array, copy=True)
        kept.flags.writeable = False
        with self._lock:
            if ident in self._items:
                return
            self._items[ident] = kept
            self.bytes += kept.nbytes
            while self.bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self.bytes -= dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0


#: the most a process's cache of drawn inputs holds (HostInputCache)
CACHE_BYTES = 256 * 2**20
#: this process's cache of drawn inputs
CACHE = HostInputCache(CACHE_BYTES)


def cache_within(address_space: int | None) -> int:
    """The cache's limit in a process whose address space is capped (a worker's RLIMIT_AS, shared with the kernel's
    own arrays): an eighth of the cap at most, so the cache never decides whether a case fits."""
    if address_space is None or address_space <= 0:
        return CACHE_BYTES
    return min(CACHE_BYTES, address_space // 8)


def generate(spec: InputSpec, key: tuple[int, int], stream: int, out: np.ndarray | None = None) -> np.ndarray:
    """Input ``stream`` of a case on the host, whole, into ``out`` when given (any C-contiguous array).
    Table-drawn inputs go through :data:`CACHE`; the array returned without ``out`` is the caller's own."""
    dtype = np_dtype(spec.dtype)
    if spec.table is not None:
        ident = CACHE.ident(spec, key, stream)
        cached = CACHE.get(ident)
        if cached is not None:
            if out is None:
                return np.array(cached, copy=True)
            np.copyto(out.reshape(-1), cached.reshape(-1))
            return out
        made = _draw(spec, key, stream, out)
        CACHE.put(ident, made)
        return made
    made = np.asarray(spec.host(np.random.default_rng(stream_seed(key, stream))), dtype=dtype).reshape(spec.shape)
    if out is None:
        return made
    np.copyto(out, made)
    return out


def _draw(spec: InputSpec, key: tuple[int, int], stream: int, out: np.ndarray | None) -> np.ndarray:
    """A table-drawn input from the generator itself (no cache)."""
    if out is None:
        out = np.empty(spec.shape, dtype=np_dtype(spec.dtype))
    flat = out.reshape(-1)
    chunk = 1 << 18   # bounds the temporaries (and keeps them in cache); the content does not depend on it
    size = spec.size
    for lo in range(0, size, chunk):
        hi = min(size, lo + chunk)
        spec.table.values_of(lanes(key, stream, lo, hi), out=flat[lo:hi], pattern=spec.pattern, start=lo)
    return out


def generate_range(spec: InputSpec, key: tuple[int, int], stream: int, start: int, stop: int) -> np.ndarray:
    """Elements [start, stop) (flat, C order) of a table-drawn input, without the others."""
    return spec.table.values_of(lanes(key, stream, start, stop), pattern=spec.pattern, start=start)


def generate_all(specs: Mapping[str, InputSpec], key: tuple[int, int]) -> dict[str, np.ndarray]:
    """Every input of a case on the host; input number ``t`` (in ``specs`` order) is stream ``t``."""
    return {name: generate(spec, key, t) for t, (name, spec) in enumerate(specs.items())}


class RegeneratedInputs(Mapping):
    """A case's inputs as the judge sees them: regenerated on the host from the key, each input when first
    asked for. Its ``specs`` and ``key`` let a device plugin regenerate them on its own device instead
    (``kbench_float64_reference``), so a large reference needs no host copy at all."""

    def __init__(self, specs: Mapping[str, InputSpec], key: tuple[int, int]) -> None:
        self.specs, self.key = dict(specs), key
        self._made: dict[str, np.ndarray] = {}

    def stream(self, name: str) -> int:
        return list(self.specs).index(name)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._made:
            if name not in self.specs:
                raise KeyError(name)
            self._made[name] = generate(self.specs[name], self.key, self.stream(name))
        return self._made[name]

    def __iter__(self):
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    def rows(self, name: str, index: tuple[slice | np.ndarray, ...]) -> np.ndarray:
        """``self[name][index]`` where index selects along the first two axes (batch, row), computing only
        those elements: the query rows the judge checks of a 16k-token case, without the whole tensor."""
        if name in self._made or self.specs[name].table is None:
            return self[name][index]
        spec = self.specs[name]
        whole = CACHE.get(CACHE.ident(spec, self.key, self.stream(name)))
        if whole is not None:  # drawn whole already (another backend's record of this case): no new draw
            return np.array(whole[index], copy=True)
        batch, rows = index[0], index[1]
        b_idx = np.arange(spec.shape[0])[batch]
        r_idx = np.arange(spec.shape[1])[rows]
        inner = int(np.prod(spec.shape[2:], dtype=np.int64))
        out = np.empty((len(b_idx), len(r_idx), *spec.shape[2:]), dtype=np_dtype(spec.dtype))
        for i, b in enumerate(b_idx):
            for j, r in enumerate(r_idx):
                start = (int(b) * spec.shape[1] + int(r)) * inner
                out[i, j] = generate_range(spec, self.key, self.stream(name), start, start + inner).reshape(spec.shape[2:])
        return out


def philox_source() -> str:
    """Philox4x64-10 and the lane gather as CUDA C++ (``__host__ __device__``), the device generator's source.

    The same text compiles as plain C++ (``KBENCH_HOST_ONLY``), which is how its equality with NumPy is tested
    on a machine without a GPU.
    """
    return PHILOX_CUDA


PHILOX_CUDA = r"""
#ifdef KBENCH_HOST_ONLY
#define KB_FN static inline
typedef unsigned long long u64;
KB_FN u64 kb_mulhi(u64 a, u64 b) { return (u64)(((unsigned __int128)a * b) >> 64); }
#else
#define KB_FN __device__ __forceinline__
typedef unsigned long long u64;
KB_FN u64 kb_mulhi(u64 a, u64 b) { return __umul64hi(a, b); }
#endif

/* Philox4x64-10 (Salmon et al. 2011), as numpy.random.Philox: word w of block b is
   kb_philox(b + 1, stream, key)[w] */
KB_FN void kb_philox(u64 c0, u64 c1, u64 k0, u64 k1, u64 out[4]) {
    u64 c2 = 0, c3 = 0;
    for (int r = 0; r < 10; ++r) {
        u64 hi0 = kb_mulhi(0xD2E7470EE14C6C93ULL, c0), lo0 = 0xD2E7470EE14C6C93ULL * c0;
        u64 hi1 = kb_mulhi(0xCA5A826395121157ULL, c2), lo1 = 0xCA5A826395121157ULL * c2;
        u64 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
        k0 += 0x9E3779B97F4A7C15ULL; k1 += 0xBB67AE8584CAA73BULL;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* the 16-bit table index of element e of input `stream` */
KB_FN unsigned int kb_lane(u64 e, u64 stream, u64 k0, u64 k1) {
    u64 words[4];
    kb_philox(e / 16 + 1, stream, k0, k1, words);
    u64 w = words[(e / 4) % 4];
    return (unsigned int)((w >> (16 * (e % 4))) & 0xFFFFULL);
}
"""
