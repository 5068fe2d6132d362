#!/bin/sh
# Check the hosts of a hostfile before a job: ssh without a prompt, the same Python and fastcoll
# on every host, and every host able to reach the others' listed addresses.
#   launch/check_hosts.sh hosts.json [more fastcoll-launch options, e.g. --python PATH]
# It is `fastcoll-launch --check`; this script only finds the launcher when it is not installed.
set -e
file=${1:?usage: $0 HOSTFILE [fastcoll-launch options]}
shift
if command -v fastcoll-launch >/dev/null 2>&1; then
    exec fastcoll-launch --check --hostfile "$file" "$@"
fi
exec "${PYTHON:-python3}" -m fastcoll.launch --check --hostfile "$file" "$@"
