import json
import os

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from protocol.arrays import to_object_array
from protocol.data_proto import DataProto
from protocol.disk import METADATA_KEY, DataProtoFileError
from protocol.json_codec import decode_value, encode_value
from protocol.testing import assert_dataproto_equal

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.complex64,
    torch.float8_e4m3fn, torch.float8_e5m2,
]


def test_round_trip_every_dtype(tmp_path):
    tensors = {
        str(dtype).removeprefix("torch."): (torch.arange(12).view(4, 3) % 5).to(dtype) for dtype in DTYPES
    }
    data = DataProto.from_dict(tensors)
    path = tmp_path / "dtypes.safetensors"
    data.save_to_disk(path)
    assert_dataproto_equal(DataProto.load_from_disk(path), data)


def test_round_trip_full_sample(sample, tmp_path):
    sample.non_tensor_batch["nested"] = to_object_array([[i, [i, "x"], None, (1, 2)] for i in range(6)])
    sample.non_tensor_batch["fixed_str"] = np.array(["a", "bb", "c", "d", "e", "f"])
    sample.non_tensor_batch["ints2d"] = np.arange(12, dtype=np.int32).reshape(6, 2)
    sample.non_tensor_batch["flags"] = np.array([True, False] * 3)
    sample.meta_info.update(
        {"name": "run", "none": None, "flag": True, "nested": {"a": [1, 2.5, {"b": "c"}]},
         "np_scalar": np.float32(0.5), "np_array": np.arange(3), "tuple": (1, 2), "nan": float("nan")}
    )
    path = tmp_path / "sample.safetensors"
    sample.save_to_disk(str(path))
    loaded = DataProto.load_from_disk(path)

    assert loaded.non_tensor_batch["nested"][1] == [1, [1, "x"], None, [1, 2]]  # tuples come back as lists
    assert loaded.non_tensor_batch["info"][2] == {"i": 2, "tags": [2, 3]}
    assert loaded.non_tensor_batch["fixed_str"].dtype == np.dtype("<U2")
    assert loaded.non_tensor_batch["ints2d"].dtype == np.int32
    assert loaded.meta_info["np_scalar"] == 0.5 and isinstance(loaded.meta_info["np_scalar"], float)
    assert loaded.meta_info["tuple"] == [1, 2]
    sample.non_tensor_batch["nested"] = to_object_array([[i, [i, "x"], None, [1, 2]] for i in range(6)])
    sample.meta_info["np_scalar"] = 0.5
    sample.meta_info["tuple"] = [1, 2]
    assert_dataproto_equal(loaded, sample)
    assert loaded.batch["extra", "mask"].dtype == torch.bool
    assert list(loaded.batch.keys(include_nested=True)) == list(sample.batch.keys(include_nested=True))
    assert list(loaded.non_tensor_batch) == list(sample.non_tensor_batch)
    loaded.batch["values"].add_(1)  # loaded tensors are ordinary writable tensors


def test_slices_and_shared_storage_are_saved(sample, tmp_path):
    base = torch.arange(20.0)
    data = DataProto.from_dict({"a": base[:5], "b": base[5:10]}, {"c": base[10:15].numpy()})
    data.save_to_disk(tmp_path / "s.safetensors")
    loaded = DataProto.load_from_disk(tmp_path / "s.safetensors")
    assert_dataproto_equal(loaded, data)
    sample[2:4].save_to_disk(tmp_path / "slice.safetensors")
    assert_dataproto_equal(DataProto.load_from_disk(tmp_path / "slice.safetensors"), sample[2:4])


def test_empty_and_keyless(tmp_path):
    for i, data in enumerate([DataProto.from_dict(), DataProto.from_dict(non_tensors={"u": ["a"]}, meta_info={"k": 1})]):
        data.save_to_disk(tmp_path / f"{i}.safetensors")
        assert_dataproto_equal(DataProto.load_from_disk(tmp_path / f"{i}.safetensors"), data)


def test_unencodable_value_names_key_index_and_type(sample, tmp_path):
    sample.non_tensor_batch["bad"] = to_object_array([1, 2, 3, {1, 2}, 5, 6])
    with pytest.raises(TypeError, match=r"non_tensor_batch\['bad'\]\[3\] of type set"):
        sample.save_to_disk(tmp_path / "x.safetensors")
    del sample.non_tensor_batch["bad"]
    sample.meta_info["obj"] = {"inner": [object()]}
    with pytest.raises(TypeError, match=r"meta_info\['obj'\]\['inner'\]\[0\] of type object"):
        sample.save_to_disk(tmp_path / "x.safetensors")
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_save_is_atomic_over_existing_file(sample, tmp_path):
    path = tmp_path / "d.safetensors"
    sample.save_to_disk(path)
    sample[:2].save_to_disk(path)
    assert len(DataProto.load_from_disk(path)) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["d.safetensors"]


def test_file_is_plain_safetensors_with_json_metadata(sample, tmp_path):
    path = tmp_path / "d.safetensors"
    sample.save_to_disk(path)
    with safe_open(path, framework="pt") as f:
        header = json.loads(f.metadata()[METADATA_KEY])
        names = set(f.keys())
    assert header["format"] == "DataProto" and header["version"] == 1
    assert "batch\x1fextra\x1flogp" in names and "non_tensor\x1fscore" in names


def test_malformed_files_give_clear_errors(tmp_path):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(DataProtoFileError, match="not a valid safetensors file"):
        DataProto.load_from_disk(garbage)

    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, plain)
    with pytest.raises(DataProtoFileError, match="not a DataProto file"):
        DataProto.load_from_disk(plain)

    broken = tmp_path / "broken.safetensors"
    save_file({"w": torch.zeros(2)}, broken, metadata={METADATA_KEY: "{not json"})
    with pytest.raises(DataProtoFileError, match="malformed DataProto metadata"):
        DataProto.load_from_disk(broken)

    missing = tmp_path / "missing.safetensors"
    header = {"format": "DataProto", "version": 1, "batch": {"batch_size": [2], "nested": [], "leaves": [["x"]]},
              "non_tensor_batch": {}, "meta_info": {"dict": {}}}
    save_file({"w": torch.zeros(2)}, missing, metadata={METADATA_KEY: json.dumps(header)})
    with pytest.raises(DataProtoFileError, match="does not contain it"):
        DataProto.load_from_disk(missing)

    with pytest.raises(FileNotFoundError):
        DataProto.load_from_disk(tmp_path / "absent.safetensors")


def test_json_codec_round_trip_and_tags():
    value = {"s": "x", "i": 1, "f": 1.5, "b": False, "n": None, "l": [1, [2]], "d": {"dict": "not a tag"},
             "arr": np.array([[1, 2]], dtype=np.int16), "objs": to_object_array(["a", {"k": 1}])}
    decoded = decode_value(json.loads(json.dumps(encode_value(value, "v"))))
    assert decoded["d"] == {"dict": "not a tag"}  # user dicts that look like tags stay dicts
    assert decoded["arr"].dtype == np.int16 and decoded["arr"].shape == (1, 2)
    assert decoded["objs"][1] == {"k": 1}
    with pytest.raises(TypeError, match=r"v\['k'\]: dict key 1 is int"):
        encode_value({"k": {1: 2}}, "v")
    with pytest.raises(ValueError, match="malformed"):
        decode_value({"unknown": 1})


def test_tempfile_cleanup_on_failure(tmp_path):
    data = DataProto.from_dict({"x": torch.zeros(2, dtype=torch.complex128)})
    with pytest.raises(TypeError, match=r"x has dtype torch.complex128"):
        data.save_to_disk(tmp_path / "c.safetensors")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("dtype", [np.uint16, np.uint64, np.int8, np.float16, np.complex64, np.bool_, ">i4"])
def test_numeric_non_tensor_arrays_round_trip(tmp_path, dtype):
    array = (np.arange(6) % 2).astype(dtype)
    data = DataProto.from_dict(non_tensors={"a": array})
    data.save_to_disk(tmp_path / "n.safetensors")
    loaded = DataProto.load_from_disk(tmp_path / "n.safetensors").non_tensor_batch["a"]
    assert loaded.dtype == np.dtype(dtype).newbyteorder("=") and np.array_equal(loaded, array)


def test_oversized_header_is_refused_clearly(tmp_path, monkeypatch):
    import protocol.disk

    monkeypatch.setattr(protocol.disk, "MAX_HEADER_BYTES", 100)
    data = DataProto.from_dict(non_tensors={"text": ["x" * 200]})
    with pytest.raises(ValueError, match="smaller pieces"):
        data.save_to_disk(tmp_path / "big.safetensors")
