#!/usr/bin/env bash
# Open MPI's settings for every job (images/openmpi-mca-params.conf), appended to the system MCA parameters file
# that every Open MPI process reads at start, mpirun and each node's orted alike, then read back through ompi_info:
# the build fails where Open MPI would not take one of them (a misspelt name, another sysconfdir). Run by each
# runtime stage (images/pytorch/Dockerfile, images/tensorflow/Dockerfile) and by tests/images against a copy.
#
#   mpi_settings.sh SETTINGS [TARGET]    TARGET: $(ompi_info --path sysconfdir)/openmpi-mca-params.conf by default
set -euo pipefail
settings="${1:?usage: mpi_settings.sh SETTINGS [TARGET]}"
target="${2:-$(ompi_info --path sysconfdir --parsable | cut -d: -f3-)/openmpi-mca-params.conf}"
{ echo; cat "${settings}"; } >> "${target}"

grep -E '^[[:space:]]*[a-z0-9_]+[[:space:]]*=' "${settings}" | while IFS='=' read -r name value; do
  name="$(echo "${name}" | tr -d '[:space:]')"
  value="$(echo "${value}" | tr -d '[:space:]')"
  # Read as an mpirun would without the job's variable: the target file only, no OMPI_MCA_ override.
  got="$(env -u "OMPI_MCA_${name}" OMPI_MCA_mca_base_param_files="${target}" \
    ompi_info --param all all --level 9 --parsable | grep -E "^mca:[^:]+:[^:]+:param:${name}:(value|source):" || true)"
  if ! grep -qx "mca:[^:]*:[^:]*:param:${name}:value:${value}" <<<"${got}" \
     || ! grep -q "param:${name}:source:file (${target}" <<<"${got}"; then
    echo "mpi_settings.sh: Open MPI does not read ${name} = ${value} from ${target}; ompi_info says:" >&2
    echo "${got:-nothing about ${name}}" >&2
    exit 1
  fi
  echo "mpi_settings.sh: ${name} = ${value} (${target})"
done
