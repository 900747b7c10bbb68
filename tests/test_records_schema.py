"""Every stored record validates against the JSON Schema kept beside its typed definition,
and the two say the same thing: the typed definition's keys are the schema's properties,
its required keys the schema's required. jsonschema is a test-only dependency; the package
never imports it (tests/test_package.py blocks it)."""
import copy
import json
import sys
from pathlib import Path

import jsonschema
import pytest

from kimi_mlp import tiles
from kimi_mlp.apparatus import codegen, provenance, records

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import bench_load  # noqa: E402

DATA = ROOT / "book" / "data"


def _schema_for(path: Path) -> dict:
    "The JSON Schema a stored file answers to, by its `schema` field or its name."
    data = json.loads(path.read_text())
    by_name = {records.BENCH_SCHEMA: records.BENCH_RECORD_JSON_SCHEMA,
               provenance.CEILINGS_SCHEMA: provenance.CEILINGS_JSON_SCHEMA,
               codegen.MODEL_SCHEMA: codegen.MODEL_JSON_SCHEMA,
               tiles.TILES_SCHEMA: tiles.TILES_JSON_SCHEMA}
    if path.name == "06_load_bench.json":
        return bench_load.LOAD_BENCH_JSON_SCHEMA
    return by_name.get(data.get("schema"))


#: Every stored record: book/data and the shipped tile tables (the GPUs' datasheet
#: figures are Python data, appendix G's registry, checked by tests/test_gpus.py).
STORED = sorted([*DATA.glob("*.json"), *(ROOT / "kimi_mlp" / "configs").glob("*.json")])


def test_every_stored_record_has_a_schema():
    assert {p.name for p in STORED} >= {"h200_ceilings.json", "h200_model.json",
                                        "06_load_bench.json"}
    missing = [p.name for p in STORED if _schema_for(p) is None]
    assert not missing, f"stored JSON with no schema here: {missing}"


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.name)
def test_the_stored_record_validates(path):
    schema = _schema_for(path)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(json.loads(path.read_text()))


def _bench_record() -> dict:
    "A measurement record as the harness writes it, one provider at one M."
    return {"schema": records.BENCH_SCHEMA, "kind": "measurement", "complete": True,
            "environment": {"date_utc": "2026-12-01T00:00:00+00:00", "gpu": "NVIDIA H200"},
            "entry_point": "python -m kimi_mlp bench",
            "shapes": {"hidden_size": 7168, "intermediate_size": 18432},
            "settings": {"m": [1]}, "ceilings": {"copy_bytes_per_s": 4.3e12,
                                                 "bf16_flop_per_s": 7.9e14,
                                                 "fp8_flop_per_s": None},
            "providers": {"fused": {"available": True}}, "kernel_choices": {},
            "results": [{"provider": "fused", "m": 1, "median_ms": 0.1, "ok": True,
                         "rel_err": 1e-3}],
            "launches": [], "skipped": [], "not_run_m": [], "elapsed_s": 12.0}


def _tiles_file() -> dict:
    config = {"SWAP": True, "BLOCK_M": 16, "BLOCK_N": 128, "GROUP_M": 8, "TMA_A": False,
              "num_warps": 4, "num_stages": 4, "regs": 128, "split_k": 8}
    return {"schema": tiles.TILES_SCHEMA, "device": "NVIDIA H200", "sms": 132,
            "rows": [{"kind": "gate_up", "n": 18432, "k": 7168, "m_max": None,
                      "tuned": True, "median_us": 60.0, "config": config}]}


#: Each kind: (a valid record, its schema, the runtime check that takes a record, or
#: None where the loader reads a file: tiles and ceilings have tests of their own).
def _record_types():
    model = json.loads((DATA / "h200_model.json").read_text())
    return {
        "bench": (_bench_record(), records.BENCH_RECORD_JSON_SCHEMA,
                  records.validate_record),
        "ceilings": (json.loads((DATA / "h200_ceilings.json").read_text()),
                     provenance.CEILINGS_JSON_SCHEMA, None),
        "model": (model, codegen.MODEL_JSON_SCHEMA, None),
        "tiles": (_tiles_file(), tiles.TILES_JSON_SCHEMA, None),
        "load_bench": (json.loads((DATA / "06_load_bench.json").read_text()),
                       bench_load.LOAD_BENCH_JSON_SCHEMA, None),
    }


@pytest.mark.parametrize("kind", ["bench", "ceilings", "model", "tiles", "load_bench"])
def test_a_valid_record_passes_and_a_broken_one_fails(kind):
    """The record passes; without a required key, or with a required key of the wrong
    type, it fails the schema (and the runtime check, where there is one)."""
    good, schema, check = _record_types()[kind]
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(good)
    if check is not None:
        check(copy.deepcopy(good))
    for key in schema["required"]:
        missing = {k: v for k, v in good.items() if k != key}
        assert not validator.is_valid(missing), f"{kind}: passes without {key!r}"
        wrong = dict(good, **{key: [] if not isinstance(good[key], list) else {}})
        assert not validator.is_valid(wrong), f"{kind}: passes with {key!r} of another type"
        if check is not None:
            for bad in (missing, wrong):
                with pytest.raises(ValueError, match=key):
                    check(copy.deepcopy(bad))


@pytest.mark.parametrize("path, edit", [
    ("results", lambda r: r["results"][0].update(median_ms=-1.0)),
    ("results", lambda r: r["results"][0].pop("ok")),
    ("kind", lambda r: r.update(kind="guess")),
    ("ceilings", lambda r: r["ceilings"].update(copy_bytes_per_s=0)),
])
def test_the_bench_schema_looks_inside(path, edit):
    record = _bench_record()
    edit(record)
    errors = list(jsonschema.Draft202012Validator(
        records.BENCH_RECORD_JSON_SCHEMA).iter_errors(record))
    assert errors and errors[0].path[0] == path, errors


@pytest.mark.parametrize("edit", [
    lambda t: t["rows"][0]["config"].update(BLOCK_M=48),
    lambda t: t["rows"][0]["config"].pop("regs"),
    lambda t: t["rows"][0]["config"].update(extra=1),
    lambda t: t["rows"][0].update(kind="down"),
    lambda t: t["rows"][0].update(m_max=0),
])
def test_the_tiles_schema_and_load_tiles_refuse_the_same_rows(edit, tmp_path):
    table = _tiles_file()
    edit(table)
    assert not jsonschema.Draft202012Validator(tiles.TILES_JSON_SCHEMA).is_valid(table)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match="rows"):
        tiles.load_tiles(path)


def _object_schemas(schema: dict):
    "The schema's objects that have properties, by where they are."
    yield "", schema
    props = schema.get("properties", {})
    for key, sub in props.items():
        if isinstance(sub, dict):
            for where, s in _object_schemas(sub):
                yield f".{key}{where}", s
    for key in ("items", "additionalProperties"):
        sub = schema.get(key)
        if isinstance(sub, dict):
            for where, s in _object_schemas(sub):
                yield f"[{key}]{where}", s


#: (typed definition, JSON Schema, where in it the object is).
TYPED = [
    (records.BenchRecord, records.BENCH_RECORD_JSON_SCHEMA, ""),
    (records.BenchResult, records.BENCH_RECORD_JSON_SCHEMA, ".results[items]"),
    (provenance.CeilingsFile, provenance.CEILINGS_JSON_SCHEMA, ""),
    (codegen.ModelFile, codegen.MODEL_JSON_SCHEMA, ""),
    (codegen.ModelEntry, codegen.MODEL_JSON_SCHEMA, ".entries[additionalProperties]"),
    (codegen.ModelRow, codegen.MODEL_JSON_SCHEMA,
     ".entries[additionalProperties].rows[items]"),
    (tiles.TilesFile, tiles.TILES_JSON_SCHEMA, ""),
    (tiles.TileRow, tiles.TILES_JSON_SCHEMA, ".rows[items]"),
    (tiles.TileConfig, tiles.TILES_JSON_SCHEMA, ".rows[items].config"),
    (bench_load.LoadBench, bench_load.LOAD_BENCH_JSON_SCHEMA, ""),
    (bench_load.LoadBenchMethod, bench_load.LOAD_BENCH_JSON_SCHEMA,
     ".results[additionalProperties]"),
]


@pytest.mark.parametrize("typed, schema, where", TYPED, ids=lambda t: getattr(t, "__name__", ""))
def test_the_typed_definition_and_the_schema_name_the_same_keys(typed, schema, where):
    obj = dict(_object_schemas(schema))[where]
    assert set(obj["properties"]) == set(typed.__annotations__), typed.__name__
    assert set(obj["required"]) == set(typed.__required_keys__), typed.__name__


def test_the_runtime_checks_read_the_typed_definitions():
    "The key lists the loaders check are the typed definitions', not copies of them."
    assert list(records._REQUIRED_TYPES) == [k for k in records.BenchRecord.__annotations__
                                             if k in records.BenchRecord.__required_keys__
                                             and k != "schema"]
    assert provenance.CEILING_RATES == ("copy_bytes_per_s", "bf16_flop_per_s",
                                        "fp8_flop_per_s")
    assert set(tiles._TILE_FIELDS) == set(tiles.TileConfig.__annotations__)
    assert set(tiles._OPTIONAL_TILE_FIELDS) == tiles.TileConfig.__optional_keys__
    assert set(codegen._COMPILED) | {"rows"} == codegen.ModelEntry.__required_keys__

