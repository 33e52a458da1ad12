"""The state an offloaded transformer's stand-ins share: the client, the
served model's description, the schedule and the row cache."""

from __future__ import annotations

import collections
import copy
import os
import pickle
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from temb._offload.description import (DTYPE_NAMES, Capture, Described,
                                       config_differences, dtype_of,
                                       weight_differences)

# torch.compile's marker for code it leaves to eager mode (PyTorch >= 2.1).
not_compiled = getattr(getattr(torch, "compiler", None), "disable",
                       lambda function: function)

# A row's cache key: the bytes of each captured input's row, the timestep's
# first.
_Key = Tuple[bytes, ...]
_Row = Dict[str, torch.Tensor]


def _product(shape: Sequence[int]) -> int:
    count = 1
    for extent in shape:
        count *= int(extent)
    return count


class Answer:
    """A call's answer: each distinct row once ({output: [U, ...]}) and, for
    each row the embedder received, which of them it is (`index`, [N]).
    A module reads its part with take(), as the shape it replaces."""

    def __init__(self, rows: Dict[str, torch.Tensor],
                 index: torch.Tensor) -> None:
        self.rows = rows
        self.index = index

    def to(self, device: Any,
           dtypes: Dict[str, torch.dtype]) -> Answer:
        return Answer({name: value.to(device=device, dtype=dtypes[name],
                                      non_blocking=True)
                       for name, value in self.rows.items()},
                      self.index.to(device, non_blocking=True))

    def renamed(self, names: Dict[str, str]) -> Answer:
        """The same rows where a module asking for `name` reads
        names[name] (a second embedding read by the same modules)."""
        return Answer({name: self.rows[names.get(name, name)]
                       for name in self.rows}, self.index)

    def first(self, count: int) -> Answer:
        """The answer for the first `count` rows received."""
        return Answer(self.rows, self.index[:count])

    def fits(self, lead: Sequence[int]) -> bool:
        return self.index.numel() in (1, _product(lead))

    def take(self, name: str, block: Optional[int],
             lead: Sequence[int]) -> torch.Tensor:
        """Output `name` (block `block` of it) for rows laid out as `lead`
        (the received rows, [N] or per token [B, seq])."""
        value = self.rows[name]
        if block is not None:
            value = value[:, block]
        index = self.index
        if index.numel() == 1:
            index = index.expand(_product(lead))
        return value[index.reshape(tuple(lead))]


def _rows_of(capture: Capture, value: Any,
             dtype: torch.dtype) -> torch.Tensor:
    """A captured value as float32 rows ([R] or [R, width]), exactly: the
    server takes it bit for bit, and a value float32 (or, for an input the
    pipeline hands in the model's dtype, `dtype`) does not hold is not one
    a pipeline hands a transformer."""
    if value is None:
        raise ValueError(
            f"offload_conditioning: the transformer was called without "
            f"{capture.argument!r}"
            + (f" of {capture.module}" if capture.module else "")
            + f", which its conditioning model takes as {capture.name!r}")
    tensor = torch.as_tensor(value).detach().to("cpu")
    exact = tensor.to(torch.float32)
    if tensor.dtype != exact.dtype and not bool(
            (exact.to(tensor.dtype) == tensor).all()):
        raise ValueError(
            f"offload_conditioning: {capture.name} {tensor.dtype} values "
            "that float32 does not hold were handed to the transformer")
    if capture.in_model_dtype and not bool(
            (exact.to(dtype).to(torch.float32) == exact).all()):
        bad = exact[exact.to(dtype).to(torch.float32) != exact][0].item()
        raise ValueError(
            f"offload_conditioning: the transformer received {capture.name} "
            f"{bad!r}, not a {dtype} value as its pipeline passes it; is the "
            "transformer called the way its pipeline calls it?")
    return (exact.reshape(-1) if capture.width <= 1
            else exact.reshape(-1, capture.width))


def recipe_of(client: Any) -> Tuple[str, Any]:
    """What reopens an equal client elsewhere (after pickle, in a forked
    child): a temb.Client's settings, a temb.local engine's, or the object
    itself for any other client, which must then pickle without its
    connection."""
    from temb import local
    from temb.client import Client
    if isinstance(client, Client):
        return ("client", dict(client.settings))
    if isinstance(client, local.Engine):
        return ("engine", dict(client.settings))
    return ("object", client)


def reopen(recipe: Tuple[str, Any]) -> Any:
    kind, value = recipe
    if kind == "client":
        from temb.client import Client
        return Client(**value)
    if kind == "engine":
        from temb import local
        return local.engine(**value)
    return pickle.loads(pickle.dumps(value))


def served_model(client: Any, model: str) -> Any:
    """The ready conditioning model `model` of ``client.models()``."""
    found = [m for m in client.models() if getattr(m, "name", None) == model]
    if not found:
        raise ValueError(f"offload_conditioning: the server has no "
                         f"conditioning model {model!r}")
    served = found[0]
    state = getattr(served, "state", "ready")
    if state != "ready":
        raise ValueError(
            f"offload_conditioning: temb model {model!r} is {state}"
            + (f": {served.message}" if getattr(served, "message", "")
               else ""))
    return served


class OffloadedConditioning:
    """What offload_conditioning returns, shared by the modules it put in
    the transformer: the client, the served model's name and description,
    the schedule and the row cache.

    Attributes:
      calls: how many times the client was asked (the cache's misses).
      freed_bytes: the parameter and buffer bytes the patch released.
      replaced: the qualified names of the modules replaced.
    """

    def __init__(self, described: Described, client: Any, model: str,
                 expected: Dict[str, Tuple[int, ...]], dtype: torch.dtype,
                 cache_bytes: int, timeout: Optional[float]) -> None:
        self.described = described
        self.model = model
        self.expected = expected
        self.dtype = dtype
        self.cache_bytes = int(cache_bytes)
        self.timeout = timeout
        self.calls = 0
        self.freed_bytes = 0
        self.replaced: List[str] = []
        # What a forward leaves for its own modules (the captured inputs,
        # the latest answer) is kept per thread: threads may share one
        # patched model as they may share an unpatched one.
        self._per_thread = threading.local()
        self._schedule: Optional[torch.Tensor] = None
        # The other inputs' rows (key[1:]) whose schedule was fetched.
        self._scheduled: set = set()
        self._cache: collections.OrderedDict[_Key, _Row] = \
            collections.OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()
        # The transformer's class, config and replaced weights'
        # fingerprints, compared with the served model's by
        # check_served_model().
        self.transformer_problems: List[str] = []
        self.fingerprints: Dict[str, str] = {}
        self._prefetch: Optional[threading.Thread] = None
        self._prefetch_error: Optional[BaseException] = None
        self._recipe = recipe_of(client)
        self._client = client
        self._pid = os.getpid()  # the process the client was opened in
        self._owner_pid = os.getpid()  # ... and the lock and thread made in

    # This thread's forward: what the captures recorded for its coming
    # embedder call, and the embedder's latest answer, which modules read
    # where the tensor they are given no longer carries it.  Eager under
    # torch.compile: per-thread storage is no graph's input.
    @not_compiled
    def record(self, name: str, value: Any) -> None:
        if not hasattr(self._per_thread, "captured"):
            self._per_thread.captured = {}
        self._per_thread.captured[name] = value

    @not_compiled
    def take_recorded(self) -> Dict[str, Any]:
        """What this thread's captures recorded since its last answer."""
        captured = getattr(self._per_thread, "captured", {})
        self._per_thread.captured = {}
        return captured

    @not_compiled
    def set_current(self, answer: Optional[Answer]) -> None:
        self._per_thread.current = answer

    @not_compiled
    def current(self) -> Optional[Answer]:
        """This thread's latest answer of the embedder, if any."""
        return getattr(self._per_thread, "current", None)

    def _own(self) -> None:
        """In a new process (forked, or unpickled), a lock and prefetch
        thread of its own: the parent's threads did not come along, and one
        may have held the lock at the fork."""
        if self._owner_pid != os.getpid():
            self._lock = threading.Lock()
            self._prefetch = None
            self._prefetch_error = None
            self._owner_pid = os.getpid()

    # The client: the caller's, or one reopened from the recipe in a new
    # process (unpickled, or a forked DataLoader worker).
    @property
    def client(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            self._client = reopen(self._recipe)
            self._pid = os.getpid()
        return self._client

    # --- the schedule -------------------------------------------------------

    def set_schedule(self, schedule: Any) -> None:
        """The coming denoising loop's values of the served model's
        ``timesteps`` input (``pipe.scheduler.timesteps`` after
        ``set_timesteps``; its ConditioningInput's help says where a
        pipeline maps them first); None turns prefetching off.  Their rows
        and those of t = 0 (which some models embed beside t, for clean or
        reference tokens) are fetched in one call: now, in the background,
        where the rows depend on the timestep alone; else by the first step
        that misses the cache, with that step's other inputs."""
        self._own()
        self.wait()
        self._schedule = None
        if schedule is not None:
            values = torch.as_tensor(schedule).detach().to(
                "cpu", torch.float32).reshape(-1)
            self._schedule = torch.cat([values, values.new_zeros(1)])
        self._scheduled = set()
        if self._schedule is not None and len(self.described.captures) == 1:
            self._scheduled.add(())
            self._prefetch = threading.Thread(
                target=self._prefetch_schedule, args=(self._schedule,),
                daemon=True, name="temb-conditioning-prefetch")
            self._prefetch.start()

    def wait(self) -> None:
        """Waits for a schedule being fetched in the background.  If that
        failed, the steps fetch their own rows (and raise what the server
        says)."""
        self._own()
        thread = self._prefetch
        if thread is None:
            return
        thread.join()
        self._prefetch = None
        if self._prefetch_error is not None:
            self._prefetch_error = None
            self._scheduled.discard(())

    def _prefetch_schedule(self, schedule: torch.Tensor) -> None:
        try:
            with self._lock:
                self._fetch_schedule(schedule, [()], [{}])
        except Exception as e:  # the steps will ask again
            self._prefetch_error = e

    def _fetch_schedule(self, schedule: torch.Tensor,
                        rests: List[Tuple[bytes, ...]],
                        values: List[Dict[str, torch.Tensor]]
                        ) -> Dict[_Key, _Row]:
        """The rows of every scheduled timestep for each of `rests` (the
        other captured inputs' rows, `values` by name), in one call; each
        keyed by the value the transformer hands over for that timestep,
        which the server returns beside them."""
        time = self.described.captures[0]
        count = schedule.shape[0]
        inputs: Dict[str, torch.Tensor] = {
            "timesteps": schedule.repeat(len(rests))}
        for capture in self.described.captures[1:]:
            inputs[capture.name] = torch.cat(
                [row[capture.name].expand(
                    (count,) + tuple(row[capture.name].shape[1:]))
                 for row in values])
        result = self._request(inputs, [time.stands_for])
        seen = result[time.stands_for].to(torch.float32)
        fetched = {}
        for j in range(seen.shape[0]):
            key = (seen[j].numpy().tobytes(),) + rests[j // count]
            row = {name: result[name][j].to(self.row_dtype(name)).clone()
                   for name in self.expected}
            self._store(key, row)
            fetched[key] = row
        self._scheduled.update(rests)
        return fetched

    def cache_info(self) -> Dict[str, int]:
        return {"calls": self.calls, "entries": len(self._cache),
                "bytes": self._cached_bytes}

    def clear_cache(self) -> None:
        self._own()
        self.wait()
        with self._lock:
            self._cache.clear()
            self._cached_bytes = 0
            self._scheduled = set()

    # --- checking the served model against the transformer ---------------

    def _mismatch(self, served: Dict[str, Tuple[int, ...]],
                  served_dtype: Optional[str]) -> List[str]:
        problems = []
        want = DTYPE_NAMES.get(self.dtype, str(self.dtype))
        if served_dtype is not None and served_dtype != want:
            problems.append(
                f"dtype: served {served_dtype}, transformer {want}")
        missing = sorted(set(self.expected) - set(served))
        if missing:
            problems.append(f"outputs {missing} missing")
        for name in sorted(set(self.expected) & set(served)):
            here, there = tuple(self.expected[name]), tuple(served[name])
            # Rows as [blocks, width] or [width]: a table's answer keeps
            # the chunks the model splits ([L, 6, D]), its metadata writes
            # them flat ([L, 6D]).
            if len(here) == 2 and len(there) > 2:
                there = (there[0], _product(there[1:]))
            elif len(here) == 1 and len(there) > 1:
                there = (_product(there),)
            if here == there:
                continue
            if len(here) == 2 and len(there) == 2 and here[0] != there[0]:
                problems.append(f"{name}: {there[0]} blocks served, "
                                f"{here[0]} in the transformer")
            if here[-1] != there[-1]:
                problems.append(f"{name}: width {there[-1]} served, "
                                f"{here[-1]} in the transformer")
            if len(here) != len(there):
                problems.append(f"{name}: shape {list(there)} served, "
                                f"{list(here)} in the transformer")
        return problems

    def _raise_if_mismatched(self, problems: List[str]) -> None:
        if problems:
            raise ValueError(
                f"offload_conditioning: temb model {self.model!r} does not "
                f"match the transformer: " + "; ".join(problems))

    def check_served_model(self, served: Any = None) -> bool:
        """Compares the served model (its transformer class and config, its
        outputs' names, row shapes and dtype, and its weights) with the
        transformer's; `served`: its ConditioningModel, else asked of
        ``client.models()``."""
        if served is None:
            served = served_model(self.client, self.model)
        outputs = {o.name: tuple(o.row_shape) for o in served.outputs}
        problems = list(self.transformer_problems)
        problems += self._mismatch(outputs, getattr(served, "dtype", None))
        if not problems:
            problems += weight_differences(
                self.fingerprints,
                getattr(served, "weight_fingerprints", None) or {})
        self._raise_if_mismatched(problems)
        return True

    def check_transformer(self, transformer: torch.nn.Module) -> None:
        """Records what differs between the transformer's class and config
        and the served model's, for check_served_model()."""
        self.transformer_problems = config_differences(transformer,
                                                       self.described)

    # --- rows ----------------------------------------------------------------

    def _request(self, inputs: Dict[str, torch.Tensor],
                 values: Sequence[str] = ()) -> Dict[str, torch.Tensor]:
        """The expected outputs, and the served `values`, for `inputs` by
        their served names."""
        self.calls += 1
        kwargs: Dict[str, Any] = dict(inputs)
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        answer = self.client.condition(
            self.model, outputs=sorted(self.expected) + list(values),
            return_tensors="pt", **kwargs)
        result = {name: torch.as_tensor(value)
                  for name, value in answer.items()}
        missing = [name for name in list(self.expected) + list(values)
                   if name not in result]
        if missing:
            self._raise_if_mismatched(self._mismatch(
                {k: tuple(v.shape[1:]) for k, v in result.items()}, None)
                or [f"outputs {missing} not returned"])
        return result

    def _store(self, key: _Key, row: _Row) -> None:
        size = sum(t.numel() * t.element_size() for t in row.values())
        if size > self.cache_bytes:
            return
        old = self._cache.pop(key, None)
        if old is not None:
            self._cached_bytes -= sum(t.numel() * t.element_size()
                                      for t in old.values())
        self._cache[key] = row
        self._cached_bytes += size
        while self._cached_bytes > self.cache_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= sum(t.numel() * t.element_size()
                                      for t in evicted.values())

    def row_dtype(self, name: str,
                  dtype: Optional[torch.dtype] = None) -> torch.dtype:
        """The dtype output `name` is kept and handed on in: float32 for
        an output served in float32 from a model of another dtype (Wan's
        table sums), else the transformer's (`dtype`: now, after any
        .to(dtype))."""
        served = self.described.output_dtypes.get(name)
        if served == "fp32" and self.described.dtype != "fp32":
            return torch.float32
        return dtype or self.dtype

    def answer(self, captured: Dict[str, Any],
               dtype: Optional[torch.dtype] = None
               ) -> Dict[str, torch.Tensor]:
        """{output: [N, ...]} for the captured inputs (by served name), in
        the served dtype, on the CPU."""
        found = self.rows(captured, dtype)
        return {name: found.take(name, None, (found.index.numel(),))
                for name in self.expected}

    # Under torch.compile the call to temb runs eagerly (a graph break):
    # dynamo cannot trace a network or native call, and the rows it returns
    # enter the compiled graph as inputs, new each step.
    @not_compiled
    def rows(self, captured: Dict[str, Any],
             dtype: Optional[torch.dtype] = None) -> Answer:
        """As :meth:`answer`, but each distinct row once, with the index of
        each received row among them: per-token timesteps ([B, seq],
        flattened) hold few distinct values, and neither the call nor the
        answer grows with the tokens."""
        self._own()
        if self._prefetch is not None:
            self.wait()
        captures = self.described.captures
        parts = [_rows_of(c, captured.get(c.name), self.dtype)
                 for c in captures]
        # One row of an input may stand for every row.
        n = max(x.shape[0] for x in parts)
        for capture, x in zip(captures, parts):
            if x.shape[0] not in (1, n):
                raise ValueError(f"offload_conditioning: {capture.name} has "
                                 f"{x.shape[0]} rows, the batch {n}")
        # The distinct rows, compared as integers (the bits of each value);
        # an input given once is the same for every row.
        columns = [x.view(torch.int32).reshape(n, -1).to(torch.int64)
                   for x in parts if n > 1 and x.shape[0] == n]
        if columns:
            _, index = torch.unique(torch.cat(columns, 1), dim=0,
                                    return_inverse=True)
            count = int(index.max()) + 1
            first = torch.full((count,), n, dtype=torch.int64).scatter_reduce(
                0, index, torch.arange(n), "amin")
        else:
            index = torch.zeros(n, dtype=torch.int64)
            first = torch.zeros(1, dtype=torch.int64)
        distinct = [x.expand((n,) + tuple(x.shape[1:]))[first].contiguous()
                    for x in parts]
        raw = [x.view(torch.uint8).reshape(first.shape[0], -1).numpy()
               for x in distinct]
        keys = [tuple(r[i].tobytes() for r in raw)
                for i in range(first.shape[0])]
        with self._lock:
            # The hits are taken before the fetch, whose rows may evict
            # them from a cache smaller than the rows in play.
            found = {}
            for key in keys:
                row = self._cache.get(key)
                if row is not None:
                    self._cache.move_to_end(key)
                    found[key] = row
            missing = [i for i, key in enumerate(keys) if key not in found]
            if missing:
                found.update(self._fetch(keys, missing, distinct))
            rows = [found[key] for key in keys]
        return Answer({name: torch.stack([row[name] for row in rows])
                       for name in self.expected}, index)

    def _fetch(self, keys: List[_Key], missing: List[int],
               distinct: List[torch.Tensor]) -> Dict[_Key, _Row]:
        """The rows of `missing` (indices into `keys`): with a schedule,
        first every scheduled step's rows for each of their other inputs'
        rows not fetched so before, then those still missing."""
        captures = self.described.captures
        fetched: Dict[_Key, _Row] = {}
        if self._schedule is not None:
            rests: Dict[Tuple[bytes, ...], int] = {}
            for i in missing:
                if keys[i][1:] not in self._scheduled:
                    rests.setdefault(keys[i][1:], i)
            if rests:
                values = [{c.name: distinct[k][i:i + 1]
                           for k, c in enumerate(captures) if k > 0}
                          for i in rests.values()]
                fetched = self._fetch_schedule(self._schedule, list(rests),
                                               values)
        missing = [i for i in missing if keys[i] not in fetched]
        if missing:
            inputs = {c.name: distinct[k][missing]
                      for k, c in enumerate(captures)}
            result = self._request(inputs)
            for j, i in enumerate(missing):
                row = {name: result[name][j].to(self.row_dtype(name)).clone()
                       for name in self.expected}
                self._store(keys[i], row)
                fetched[keys[i]] = row
        # This step's rows come from here even when the cache is smaller
        # than the schedule (or off: cache_bytes=0).
        return fetched

    # copy.deepcopy: the copy shares the caller's client, copies the rest.
    def __deepcopy__(self, memo: Dict[int, Any]) -> OffloadedConditioning:
        self.wait()
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        state = self.__dict__.copy()
        shared = {name: state.pop(name)
                  for name in ("_client", "_recipe", "_lock", "described")}
        del state["_per_thread"]
        clone.__dict__.update(copy.deepcopy(state, memo))
        clone.__dict__.update(shared)
        clone._lock = threading.Lock()
        clone._per_thread = threading.local()
        return clone

    # pickle: the recipe travels, never a live channel; the cache too.
    def __getstate__(self) -> Dict[str, Any]:
        self.wait()
        state = self.__dict__.copy()
        state["_client"] = None
        state["_lock"] = None
        del state["_per_thread"]
        try:
            pickle.dumps(self._recipe)
        except Exception as e:
            raise TypeError(
                "this offloaded transformer cannot be pickled: its client "
                f"({type(self._client).__name__}) cannot be reopened from "
                "pickled settings") from e
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._per_thread = threading.local()
        self._pid = -1  # reopen on first use
        self._owner_pid = os.getpid()


def served_dtype(described: Described) -> torch.dtype:
    """The served model's dtype as torch's (float32 when it says none)."""
    return dtype_of(described.dtype) or torch.float32
