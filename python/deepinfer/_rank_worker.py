"""A worker rank of a parallel LLM (data_parallel_size > 1).

The LLM's rank 0 starts ranks 1..N-1 with this module and DEEPINFER_RANK, DEEPINFER_WORLD_SIZE and
DEEPINFER_RENDEZVOUS_DIR set; each loads its model and expert shard from the config rank 0 wrote
there and serves rank 0's engine steps until it shuts down. Not meant to be run by hand."""
import sys

from . import _C


def main() -> int:
    return _C.engine.rank_worker_main()


if __name__ == "__main__":
    sys.exit(main())
