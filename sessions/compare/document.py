"""The comparison as a JSON document (docs/report-json.md), and back.

The same document is the CLI's `--json` output and the sidecar cache's content, so what a
pipeline reads and what a second open shows cannot drift apart. Non-finite floats are
written as the strings "Infinity", "-Infinity" and "NaN" to keep the document strict JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import types
from collections.abc import Callable, Iterator, Sequence
from enum import Enum
from functools import cache
from itertools import islice
from typing import Any, Union, get_args, get_origin, get_type_hints

from sessions.compare.comparison import Comparison, GrowthPoint, PairResult
from sessions.compare.json_plain import plain, plain_names
from sessions.compare.key import KeyParser, OpKey
from sessions.compare.tensor_diff import TensorMetrics
from sessions.gc_pause import garbage_collection_paused
from sessions.side_file import parse_problem

DOCUMENT_FORMAT = "parity-xray-report"
DOCUMENT_VERSION = 7
"""2: pairs carry their layout transform specs, and the profiles their identity (file, content hash).
3: every op is named by its key's text form; one verdict object (word, first finding, reasons, counts)
and a kind per pair replace the verdict string, first_finding and first_beyond_tolerance.
4: pairs carry the rows they compare (runs cut differently) and the alignment mode.
5: `dispatch_not_compared` says why the attention calls were not compared; `verdict.tokens_compared`.
6: `verdict.shared_eos` (a PARITY headline names it) and `verdict.reason_kinds`."""


class ReportFormatError(ValueError):
    pass


def comparison_to_dict(comparison: Comparison, omit: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {"format": DOCUMENT_FORMAT, "version": DOCUMENT_VERSION, **plain(comparison, omit)}


LISTS = (list, Sequence)
"""Annotations read as a JSON array: a comparison's pairs are a `Sequence` (`PairResults` when
compared here, a list when read back)."""


def from_plain(tp: Any, value: Any) -> Any:
    """The inverse of `plain` for a value of type `tp` (a dataclass tree): the report and gate documents read back."""
    return _reader(tp)(value)


Reader = Callable[[Any], Any]


@cache
def _reader(tp: Any) -> Reader:
    """A function turning a plain value into a `tp`, built once per type: resolving a dataclass's
    type hints costs more than building it, and a real model's document has millions of objects."""
    if tp is OpKey:
        return OpKey.parse
    if isinstance(tp, type) and issubclass(tp, Enum):
        return _enum_reader(tp)
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        if len(options) != 1:
            return _same
        inner = _reader(options[0])
        return _same if inner is _same else lambda value: None if value is None else inner(value)
    if dataclasses.is_dataclass(tp):
        return _dataclass_reader(tp)
    if origin in LISTS:
        (item,) = get_args(tp)
        read_item = _reader(item)
        if read_item is _same:  # a list of plain values (profiles, histograms, coordinates) is taken as parsed
            return _same
        return lambda value: [read_item(v) for v in value]
    if origin is tuple:
        return tuple
    if origin is dict:
        return dict
    if tp is float:
        return lambda value: float(value) if isinstance(value, str) else value
    return _same


def _same(value: Any) -> Any:
    return value


def _enum_reader(tp: type[Enum]) -> Reader:
    """An enum's member by its value, looked up in C (the enum's call is Python, 0.15 s for a
    real model's 220,000 pair verdicts); ValueError for any other value, as the call gives."""
    members = {member.value: member for member in tp}

    def read(value: Any) -> Any:
        try:
            return members[value]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not a valid {tp.__name__}") from None

    return read


def _dataclass_reader(tp: type) -> Reader:
    hints = get_type_hints(tp)
    names = frozenset(f.name for f in dataclasses.fields(tp))
    converted = [(f.name, read_field) for f in dataclasses.fields(tp) if (read_field := _reader(hints[f.name])) is not _same]

    def read(value: Any) -> Any:
        """Only the fields that need it are converted: a real model's document has 220,000 pairs."""
        if not isinstance(value, dict):
            raise ReportFormatError(f"{tp.__name__} must be an object")
        made = dict(value)
        for extra in made.keys() - names:  # derived properties written beside the fields (`plain`)
            del made[extra]
        for name, read_field in converted:
            if name in made:
                made[name] = read_field(made[name])
        return tp(**made)

    def read_or_take(value: Any) -> Any:
        """An object already read (metrics shared by many pairs, `document_lines`) is taken as it is."""
        return value if isinstance(value, tp) else read(value)

    return read_or_take


def check_types(value: Any, tp: Any, where: str) -> None:
    """TypeError naming `where` unless `value`, as `from_plain` read it, holds what `tp` says.
    `from_plain` converts only what needs converting and takes the rest as parsed: a small
    document from elsewhere (a gate result someone sends) is checked whole, field by field, so a
    name that is a number or reasons that are a string are refused where they are, not met as
    an AttributeError in whatever shows them."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [option for option in get_args(tp) if option is not type(None)]
        if value is None and len(options) < len(get_args(tp)):
            return
        if len(options) == 1:
            # X | None holding something: X's own check names the field inside it that is wrong
            # ("gate.cases[1].tokens is CaseTokens, not ...CaseTokens | None" named none).
            check_types(value, options[0], where)
            return
        for option in options:
            try:
                check_types(value, option, where)
                return
            except TypeError:
                continue
        names = " or ".join(getattr(option, "__name__", str(option)) for option in get_args(tp))
        raise TypeError(f"{where} is {type(value).__name__}, not {names}")
    if tp is type(None) or tp is bool or tp is str or tp is OpKey or (isinstance(tp, type) and issubclass(tp, Enum)):
        ok = value is None if tp is type(None) else isinstance(value, tp)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif dataclasses.is_dataclass(tp):
        if not isinstance(value, tp):  # type: ignore[arg-type]
            raise TypeError(f"{where} is {type(value).__name__}, not an object")
        hints = get_type_hints(tp)
        for f in dataclasses.fields(tp):
            check_types(getattr(value, f.name), hints[f.name], f"{where}.{f.name}")
        return
    elif origin in LISTS:
        if not isinstance(value, list):
            raise TypeError(f"{where} is {type(value).__name__}, not a list")
        (item,) = get_args(tp)
        for at, element in enumerate(value):
            check_types(element, item, f"{where}[{at}]")
        return
    else:
        ok = True  # dicts and tuples of plain values are taken as parsed
    if not ok:
        raise TypeError(f"{where} is {type(value).__name__}, not {getattr(tp, '__name__', tp)}")


def comparison_from_dict(data: dict[str, Any]) -> Comparison:
    if data.get("format") != DOCUMENT_FORMAT or data.get("version") != DOCUMENT_VERSION:
        raise ReportFormatError(f"not a {DOCUMENT_FORMAT} version {DOCUMENT_VERSION} document")
    try:
        return from_plain(Comparison, data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportFormatError(f"malformed report document ({type(exc).__name__}: {exc})") from None


def json_pieces(comparison: Comparison) -> Iterator[str]:
    """The document for people and pipelines (the CLI's `--json`), a piece at a time, for a
    file to take as they come: one field per line, and a list's items one per line; the cache
    and the window's child write `document_lines` instead. Indenting every level took 11 s for a
    real model's 220,000 pairs (json's indenting encoder is pure Python); an item per line takes
    its C encoder, and metrics shared by identical pairs are encoded once. Made whole, the
    document and its pieces held 860 MB at once for 220,000 pairs (236 MB of JSON)."""
    with garbage_collection_paused():
        encode = json.JSONEncoder(allow_nan=False).encode
        data = comparison_to_dict(dataclasses.replace(comparison, pairs=[]), DERIVED_LISTS)
        data["error_growth"] = []
        made: dict[str, tuple[list[Any], Callable[[Any, Callable[[Any], str]], Iterator[str]]]] = {
            "pairs": (comparison.pairs, _pair_items),
            "error_growth": (comparison.error_growth, _growth_items),
        }
        yield "{\n"
        for at, (name, value) in enumerate(data.items()):
            head = (",\n" if at else "") + f" {encode(name)}: "
            listed, make = made.get(name, (value if isinstance(value, list) else [], None))
            if not listed:
                yield head + encode(value)
                continue
            yield head + "[\n  "
            items = make(listed, encode) if make is not None else (encode(item) for item in value)
            yield from _separated(items, ",\n  ")
            yield "\n ]"
        yield "\n}"


def dumps(comparison: Comparison) -> str:
    """`json_pieces` as one string, for callers that keep the document (tests, round trips)."""
    return "".join(json_pieces(comparison))


ITEMS_PER_PIECE = 1024
"""A list's items are yielded joined this many at a time (about 1 MB of a real model's pairs):
yielded one by one, a real model's 480,000 items cost as much again in the generators passing
them on as in their making."""


def _separated(items: Iterator[str], separator: str) -> Iterator[str]:
    """`separator.join(items)`, `ITEMS_PER_PIECE` items at a time."""
    items = iter(items)
    head = ""
    while batch := list(islice(items, ITEMS_PER_PIECE)):
        yield head + separator.join(batch)
        head = separator


def _pair_items(pairs: list[PairResult], encode: Callable[[Any], str]) -> Iterator[str]:
    """Each pair as JSON, its metrics last, made from its kind's template (`_templates`), and
    metrics shared by identical pairs encoded once. Through `plain`, 240,000 pairs took 5.3 s to
    write, more than their comparison; as a dict encoded per pair, 1.3 s; from templates, 0.49 s
    (0.57 s when every pair has windows of its own and its names carry the layer)."""
    template_of = _templates(_JSON_PAIR_NAMES, _OBJECT_SLOTS, _named, encode)
    shared: dict[int, str] = {}
    for pair in pairs:
        metrics = shared.get(id(pair.metrics))
        if metrics is None:
            metrics = shared[id(pair.metrics)] = encode(plain(pair.metrics))
        try:
            before_key, before_native_seq, before_oracle_seq, before_native_window, before_oracle_window, before_label, rest = template_of(pair)
            key = pair.key
            text = (
                f"{before_key}{encode(key.text())}{before_native_seq}{pair.native_seq:d}{before_oracle_seq}{pair.oracle_seq:d}"
                f"{before_native_window}{_window(pair.native_window)}{before_oracle_window}{_window(pair.oracle_window)}"
                f"{before_label}{encode(key.label())}{rest}"
            )
        except (TypeError, ValueError):  # a value of another type than PairResult's (a damaged cache entry read back)
            text = encode({name: plain(value) for name, value in zip(_JSON_PAIR_NAMES, _json_pair_values(pair))})[:-1]
        yield f'{text}, "metrics": {metrics}}}'


def _window(window: tuple[int, int] | None) -> str:
    """A window as `encode` writes it; TypeError or ValueError for anything but None or two integers."""
    if window is None:
        return "null"
    first, stop = window
    if type(first) is not int or type(stop) is not int:
        raise TypeError(f"a window holds two integers, not {window!r}")
    return f"[{first}, {stop}]"


def _templates(names: tuple[str, ...], slots: tuple[str, ...], before: Callable[[int, str], str], encode: Callable[[Any], str]) -> Callable[[PairResult], list[str]]:
    """The template of a pair's kind, made once per kind: the text of its values `names` between
    those of its `slots` (named in their order in `names`), each piece ending where a slot's value
    goes, `before(at, name)` written before each value. Pairs alike but for their slots (every
    token step's q_proj against q_proj, bit-exact) share the rest of their text: a few names,
    layouts, verdicts and reasons. A kind's template is made from a pair whose values have
    PairResult's types (`check_types`), so no odd value a damaged cache entry held (a 0 for
    False) is lent to the pairs after it; TypeError for a pair that has none."""
    kind_of = operator.attrgetter(*(name for name in names if name not in slots))
    hints = get_type_hints(PairResult)
    made: dict[tuple[Any, ...], list[str]] = {}

    def template_of(pair: PairResult) -> list[str]:
        kind = kind_of(pair)
        template = made.get(kind)
        if template is not None:
            return template
        pieces: list[str] = []
        text = ""
        for at, name in enumerate(names):
            text += before(at, name)
            if name in slots:
                pieces.append(text)
                text = ""
            else:
                value = getattr(pair, name)
                check_types(value, hints[name], name)
                text += encode(value)
        pieces.append(text)
        made[kind] = pieces
        return pieces

    return template_of


def _named(at: int, name: str) -> str:
    """What `encode(dict)` writes before a value of an object."""
    return f"{'{' if at == 0 else ', '}{json.dumps(name)}: "


def _listed(at: int, name: str) -> str:
    """What `encode(list)` writes before a value of a list."""
    return "[" if at == 0 else ", "


def _growth_items(points: list[GrowthPoint], encode: Callable[[Any], str]) -> Iterator[str]:
    """Each point of the error growth as JSON, made from its values, as `encode(dict)` writes it:
    through `plain` whole, a 240,000-point growth took 1.9 s to write; as a dict encoded per
    point, 0.84 s; made so, 0.25 s."""
    for point in points:
        key, max_ulp, nmse, differing = _growth_values(point)
        nmse_text = float.__repr__(nmse) if type(nmse) is float and math.isfinite(nmse) else encode(plain(nmse))
        max_ulp_text = f"{max_ulp}" if type(max_ulp) is int else encode(plain(max_ulp))  # None; a damaged entry's 3.5
        differing_text = f"{differing}" if type(differing) is int else encode(plain(differing))
        yield f'{{"key": {encode(key.text())}, "max_ulp": {max_ulp_text}, "nmse": {nmse_text}, "differing": {differing_text}}}'


_GROWTH_NAMES = plain_names(GrowthPoint)
_growth_values = operator.attrgetter(*_GROWTH_NAMES)


def loads(text: str) -> Comparison:
    return comparison_from_dict(_json_object(text, "the document"))


def _json_object(text: str | bytes | bytearray, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # a decode error; an integer of 4,300 digits; nesting past the stack
        raise ReportFormatError(f"{what} is not JSON ({parse_problem(exc)})") from None
    if not isinstance(data, dict):
        raise ReportFormatError(f"{what} is not an object")
    return data


DERIVED_LISTS = frozenset({"error_growth"})
"""Lists the JSON document carries for its readers that a comparison derives from its pairs:
`document_lines` leaves them out."""

PAIR_FIELDS = tuple(f.name for f in dataclasses.fields(PairResult))
"""A pair's line in `document_lines` is a row: its fields' values in this order, its metrics the
number of a METRICS_LINE. A row is read in half the time of an object with named fields."""
_METRICS_AT = PAIR_FIELDS.index("metrics")
_KEY_AT = PAIR_FIELDS.index("key")
_NATIVE_SEQ_AT, _ORACLE_SEQ_AT = PAIR_FIELDS.index("native_seq"), PAIR_FIELDS.index("oracle_seq")
_JSON_PAIR_NAMES = tuple(name for name in plain_names(PairResult) if name != "metrics")
"""A pair's names in `json_pieces`, as `plain` writes them, but for its metrics, written last."""
_json_pair_values = operator.attrgetter(*_JSON_PAIR_NAMES)
_pair_values = operator.attrgetter(*PAIR_FIELDS)
_OBJECT_SLOTS = ("key", "native_seq", "oracle_seq", "native_window", "oracle_window", "label")
"""The values of a pair in `json_pieces` that are its own, but its metrics, in their order (`_templates`)."""
_ROW_SLOTS = ("key", "native_seq", "oracle_seq", "metrics", "native_window", "oracle_window")
"""The values of a pair's row in `document_lines` that are its own, in their order (`_templates`)."""

METRICS_LINE = "metrics"
"""A line of `document_lines` that defines a pair's metrics shared by pairs after it: their
`metrics` is then its number (0 for the first such line), not an object."""


def document_lines(comparison: Comparison) -> Iterator[str]:
    """The document as lines, for a process that reads it while it shows a window: first the
    document without its lists (each list's name kept, empty), then one `NAME<TAB>ITEM` line
    per item. A real model's document is hundreds of MB; parsed in one `json.loads` it holds
    the interpreter lock for seconds, and the window with it. Line by line, it never does.
    Metrics shared by several pairs (every identical pair of one dtype and shape) are written
    once, on a METRICS_LINE before the first pair with them: a real model's 220,000 pairs took
    7.1 s to write and 5.5 s to read, more than their comparison. A pair's other values are
    JSON as they are (texts, numbers, booleans, null, a window's two numbers, its Kind, a str):
    only its key is made text, and its row is made from its kind's template (`_templates`):
    240,000 pairs' rows, each encoded as a list, took 0.73 s; from templates, 0.46-0.56 s."""
    with garbage_collection_paused():
        data = comparison_to_dict(dataclasses.replace(comparison, pairs=[]), DERIVED_LISTS)
        lists = {name: value for name, value in data.items() if isinstance(value, list)}
        yield json.dumps({**data, **{name: [] for name in lists}}, allow_nan=False)
        encode = json.JSONEncoder(allow_nan=False).encode
        shared: dict[int, int] = {}
        template_of = _templates(PAIR_FIELDS, _ROW_SLOTS, _listed, encode)
        for pair in comparison.pairs:
            number = shared.get(id(pair.metrics))
            if number is None:
                number = shared[id(pair.metrics)] = len(shared)
                yield f"{METRICS_LINE}\t{encode(plain(pair.metrics))}"
            try:
                before_key, before_native_seq, before_oracle_seq, before_metrics, before_native_window, before_oracle_window, rest = template_of(pair)
                text = (
                    f"{before_key}{encode(pair.key.text())}{before_native_seq}{pair.native_seq:d}{before_oracle_seq}{pair.oracle_seq:d}"
                    f"{before_metrics}{number:d}{before_native_window}{_window(pair.native_window)}{before_oracle_window}{_window(pair.oracle_window)}{rest}]"
                )
            except (TypeError, ValueError):  # a value of another type than PairResult's (a damaged cache entry read back)
                row = [plain(value) for value in _pair_values(pair)]
                row[_METRICS_AT], row[_KEY_AT] = number, pair.key.text()
                text = encode(row)
            yield f"pairs\t{text}"
        for name, items in lists.items():
            for item in items:
                yield f"{name}\t{encode(item)}"


def document_bytes(comparison: Comparison) -> bytes:
    """`document_lines` as UTF-8, each line ended: what `loads_lines` reads, the cache stores and the comparing child sends."""
    return "".join(f"{line}\n" for line in document_lines(comparison)).encode("utf-8")


def with_paths(data: bytes, native_path: str, oracle_path: str) -> bytes:
    """`document_bytes` of the same comparison named by other paths: only its first line (the
    document without its lists) holds them, so a cached document is not written again whole."""
    head, rest = data.split(b"\n", 1)
    fields = {**json.loads(head), "native_path": native_path, "oracle_path": oracle_path}
    return json.dumps(fields, allow_nan=False).encode("utf-8") + b"\n" + rest


def _pair_from_row(row: Any, shared: list[TensorMetrics], read_key: KeyParser) -> PairResult:
    """A pair from its row (PAIR_FIELDS), its metrics a METRICS_LINE's number, its key read by
    `read_key` (one per document)."""
    if not isinstance(row, list) or len(row) != len(PAIR_FIELDS):
        raise ValueError(f"a pair is a row of {len(PAIR_FIELDS)} values ({', '.join(PAIR_FIELDS)})")
    number = row[_METRICS_AT]
    if type(number) is not int or number < 0:
        raise ValueError(f"a pair's metrics are the number of a {METRICS_LINE} line, not {number!r}")
    if type(row[_NATIVE_SEQ_AT]) is not int or type(row[_ORACLE_SEQ_AT]) is not int:  # the writers' templates take them as integers
        raise ValueError(f"a pair's seqs are integers, not {row[_NATIVE_SEQ_AT]!r} and {row[_ORACLE_SEQ_AT]!r}")
    row[_METRICS_AT] = shared[number]
    row[_KEY_AT] = read_key(row[_KEY_AT])
    for at, read, optional in _pair_readers():
        value = row[at]
        if value is not None or not optional:
            row[at] = read(value)
    return PairResult(*row)


@cache
def _pair_readers() -> list[tuple[int, Reader, bool]]:
    """(position, reader, whether null is allowed) of a pair row's values that need reading, but
    its metrics and key (`_pair_from_row`). An optional value's reader is its type's, asked only
    for a value: a call for each null window cost as much as reading it."""
    hints = get_type_hints(PairResult)
    readers = []
    for at, name in enumerate(PAIR_FIELDS):
        if at in (_METRICS_AT, _KEY_AT):
            continue
        tp, optional = hints[name], False
        if get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp):
            kept = [arg for arg in get_args(tp) if arg is not type(None)]
            if len(kept) == 1:
                tp, optional = kept[0], True
        read = _reader(tp)
        if read is not _same:
            readers.append((at, read, optional))
    return readers


def loads_lines(data: bytes | bytearray, start: int = 0, keep_made: bool = False) -> Comparison:
    """The comparison `document_lines` wrote, as UTF-8 bytes from `start`, read line by line:
    each line is parsed and turned into its object at once. Never decoded whole (turning a real
    model's 230 MB into one str held the interpreter lock, and a window's event loop, for half
    a second), and no parsed document outlives its line (freeing 220,000 parsed items at once
    held it for another). `keep_made`: the caller keeps the comparison for long
    (`garbage_collection_paused`). Lines are read exactly as `document_lines` writes them: an
    item with spaces around it is refused, as is anything that cannot be its object.
    """
    with garbage_collection_paused(keep_made=keep_made):
        end = data.find(b"\n", start)
        head = _json_object(data[start:] if end < 0 else data[start:end], "the document's first line")
        comparison = comparison_from_dict(head)
        hints = get_type_hints(Comparison)
        items: dict[str, tuple[list[Any], Reader]] = {}
        for name, value in head.items():
            if isinstance(value, list) and get_origin(hints.get(name)) in LISTS:
                items[name] = getattr(comparison, name), _reader(get_args(hints[name])[0])
        shared: list[TensorMetrics] = []
        items[METRICS_LINE] = shared, _reader(TensorMetrics)
        decode = json.JSONDecoder().raw_decode  # json.loads guesses each line's encoding again; decode looks for spaces around it
        read_key = KeyParser()
        while end >= 0:
            begin, end = end + 1, data.find(b"\n", end + 1)
            line = data[begin:] if end < 0 else data[begin:end]
            if not line:
                continue
            raw_name, tab, item = line.partition(b"\t")
            name = raw_name.decode("utf-8", errors="replace")
            if not tab or name not in items:
                raise ReportFormatError(f"a line of the document names no list of it ({bytes(line[:60])!r})")
            try:
                text = item.decode("utf-8")
                parsed, used = decode(text)
            except (ValueError, RecursionError) as exc:
                raise ReportFormatError(f"an item of {name} is not JSON ({parse_problem(exc)})") from None
            if used != len(text):
                raise ReportFormatError(f"an item of {name} is not JSON (extra data at character {used})")
            found, read = items[name]
            try:
                found.append(_pair_from_row(parsed, shared, read_key) if name == "pairs" else read(parsed))
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise ReportFormatError(f"malformed report document ({type(exc).__name__} in an item of {name}: {exc})") from None
        return comparison
