#!/bin/bash
# One training rank, started by mpirun on a worker: restore the container environment that
# worker.sh saved, map Open MPI's rank variables to torch.distributed's, run the command.
set -euo pipefail

ENV_FILE="${DRANET_ENV_FILE:-/tmp/dranet-env.sh}"
if [[ -f "$ENV_FILE" ]]; then
  # shellcheck disable=SC1090
  source "$ENV_FILE"
fi
export RANK="$OMPI_COMM_WORLD_RANK"
export WORLD_SIZE="$OMPI_COMM_WORLD_SIZE"
export LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK"
exec "$@"
