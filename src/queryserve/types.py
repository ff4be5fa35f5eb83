"""The small shared vocabulary: datatypes as the KServe v2 protocol and Triton name them."""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
"""Any numpy array; the tensor's datatype says what it holds."""

# KServe v2 datatype -> numpy dtype. BYTES is a numpy object array of `bytes`.
NUMPY_DTYPES: Final[dict[str, Any]] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}

# KServe v2 datatype -> Triton model-config data_type (what `/config` reports).
TRITON_DATA_TYPES: Final[dict[str, str]] = {
    name: "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}" for name in NUMPY_DTYPES
}
