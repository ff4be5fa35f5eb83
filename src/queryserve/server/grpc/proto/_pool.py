"""The descriptor pool queryserve's protocol messages live in: their own, not protobuf's default.

`tritonclient.grpc` registers Triton's full `inference.*` messages in the default pool, and that
pool refuses a second definition of any of them ("duplicate symbol 'inference.DataType'"). In a
pool of their own, queryserve's subset and Triton's full messages coexist in one process (a
test with both a server codec and a Triton client, a benchmark script). `regenerate.py` points
the generated modules here.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
