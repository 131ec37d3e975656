"""Transport without Ray: byte accounting under pickle protocol 5, copies, devices, the borrow flag."""

import copy
import pickle
import threading
import warnings

import numpy as np
import pytest
import ray.cloudpickle
import torch

from protocol.data_proto import DataProto
from protocol.testing import assert_dataproto_equal, shares_memory
from protocol.transport import borrow_received_buffers, decode_tensor, encode_tensor, is_borrowing

ROWS, COLS = 4096, 256  # 4 MiB of float32


def dumps_counting(obj, dumps=pickle.dumps):
    buffers = []
    payload = dumps(obj, protocol=5, buffer_callback=buffers.append)
    return payload, buffers, len(payload), sum(memoryview(b).nbytes for b in buffers)


@pytest.mark.parametrize("dumps", [pickle.dumps, ray.cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_slice_ships_only_its_bytes(dumps):
    big = torch.randn(ROWS, COLS)
    data = DataProto.from_dict({"x": big, "ids": torch.arange(ROWS)}, {"score": np.arange(ROWS, dtype=np.float32)})
    part = data[100:116]
    expected = 16 * COLS * 4 + 16 * 8 + 16 * 4
    _, _, in_band, out_of_band = dumps_counting(part, dumps)
    assert out_of_band == expected
    assert in_band < 4096
    # The point: plain torch pickling of the same slice carries the whole storage.
    assert len(pickle.dumps(big[100:116], protocol=5)) > ROWS * COLS * 4


def test_non_contiguous_and_odd_dtypes_ship_compactly():
    big = torch.randn(ROWS, COLS)
    data = DataProto.from_dict({"col": big[:, :2], "bf": big[:, :8].to(torch.bfloat16)})
    _, _, in_band, out_of_band = dumps_counting(data)
    assert out_of_band == ROWS * 2 * 4 + ROWS * 8 * 2
    assert in_band < 4096


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool,
                                   torch.uint16, torch.float8_e4m3fn, torch.complex64])
def test_round_trip_in_band_and_out_of_band(dtype):
    data = DataProto.from_dict({"t": (torch.arange(24).view(6, 4) % 3).to(dtype)}, {"u": list("abcdef")}, {"m": [1]})
    payload, buffers, _, _ = dumps_counting(data)
    out_of_band = pickle.loads(payload, buffers=buffers)
    in_band = pickle.loads(pickle.dumps(data, protocol=5))
    for received in (out_of_band, in_band, copy.deepcopy(data), copy.copy(data)):
        assert_dataproto_equal(received, data)
    assert not shares_memory(out_of_band, data)  # default: one private copy


def test_borrowed_tensors_are_views_of_the_buffers():
    data = DataProto.from_dict({"t": torch.arange(10.0)})
    payload, buffers, _, _ = dumps_counting(data)
    with borrow_received_buffers():
        borrowed = pickle.loads(payload, buffers=buffers)
    assert shares_memory(borrowed, data)


def test_borrow_silences_read_only_warning_and_default_copies():
    packet = (np.frombuffer(np.arange(4, dtype=np.int64).tobytes(), dtype=np.int64), "int64", (2, 2), "cpu")
    assert not packet[0].flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with borrow_received_buffers():
            view = decode_tensor(packet)
        copied = decode_tensor(packet)
    assert view.data_ptr() == packet[0].ctypes.data
    assert copied.data_ptr() != packet[0].ctypes.data
    copied.add_(1)  # writable and private
    assert packet[0].tolist() == [0, 1, 2, 3]


def test_borrow_flag_is_thread_local_and_restored():
    seen = []
    with borrow_received_buffers():
        assert is_borrowing()
        thread = threading.Thread(target=lambda: seen.append(is_borrowing()))
        thread.start()
        thread.join()
        with borrow_received_buffers():
            pass
        assert is_borrowing()
    assert seen == [False] and not is_borrowing()


def test_missing_cuda_device_falls_back_to_cpu():
    tensor = torch.arange(6, dtype=torch.bfloat16).view(2, 3)
    array, dtype, shape, _ = encode_tensor(tensor)
    device = f"cuda:{torch.cuda.device_count()}"  # one index past the last GPU, so never present
    rebuilt = decode_tensor((array, dtype, shape, device))
    assert rebuilt.device.type == "cpu" and torch.equal(rebuilt, tensor)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_tensors_return_to_their_device():
    data = DataProto.from_dict({"t": torch.randn(8, 4, device="cuda").to(torch.bfloat16), "c": torch.arange(8)})
    payload, buffers, _, out_of_band = dumps_counting(data)
    assert out_of_band == 8 * 4 * 2 + 8 * 8
    received = pickle.loads(payload, buffers=buffers)
    assert received.batch["t"].device == data.batch["t"].device
    assert received.batch["c"].device.type == "cpu"
    assert torch.equal(received.batch["t"], data.batch["t"])


def test_grad_tensors_and_nested_keys(sample):
    sample.batch["w"] = torch.randn(6, 2, requires_grad=True)
    received = pickle.loads(pickle.dumps(sample, protocol=5))
    assert not received.batch["w"].requires_grad
    assert received.batch["extra"].batch_size == sample.batch["extra"].batch_size
    assert_dataproto_equal(received, sample)
