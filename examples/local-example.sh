#!/bin/sh
# The example on the embedded default: agents on this machine, no ssh needed.
# Runs in its own session directory and quits at the end, leaving nothing behind.
set -eu
GXP_SESSION=$(mktemp -d "${TMPDIR:-/tmp}/gxp-example.XXXXXX")/session
export GXP_SESSION
trap 'gxpc quit; rm -rf "$(dirname "$GXP_SESSION")"' EXIT
gxpc explore --local 4              # four agents, bootstrapped over pipes
gxpc stat                           # the tree
gxpc e -H 'echo "node $GXP_NODE_ID of $GXP_NUM_EXECS on $(hostname)"'
gxpc e -b 'python3 -c "import sys; print(sys.version.split()[0])"'
gxpc e 'test $GXP_EXEC_IDX -lt 3' || true   # some nodes fail ...
gxpc smask                          # ... select the ones that succeeded
gxpc e -H 'echo still selected'
gxpc rmask
# GMount: every node exports a directory and mounts the merged view. Local agents
# share this machine, so one mount serves them all.
top=$(dirname "$GXP_SESSION")
mkdir -p "$top/export" "$top/mnt"
gxpc mount "$top/export" "$top/mnt"
gxpc e 'echo "written by $GXP_NODE_ID" > '"$top/mnt"'/from-$GXP_NODE_ID'
ls "$top/mnt"
python3 -c 'import os, sys; print("location:", os.getxattr(sys.argv[1], "user.sshfsmux.location").decode())' "$top/mnt/from-0.1"
# A workflow: the word-count MapReduce makefile, run by GNU make with every
# recipe on one of the nodes (the map recipes spread over them), in the mount.
here=$(cd "$(dirname "$0")" && pwd)
mkdir "$top/mnt/wordcount"
cp "$here/wordcount/Makefile" "$top/mnt/wordcount/"
(cd "$top/mnt/wordcount" && gxpc make -j 8)
(cd "$top/mnt/wordcount" && gxpc make -s clean)
# A bioinformatics-shaped pipeline (split reads, align each part against a
# shared reference, merge): each recipe says where it ran and why, and the
# replica catalog knows who holds each output (local agents share one host).
mkdir "$top/mnt/pipeline"
cp "$here/pipeline/Makefile" "$here"/pipeline/*.py "$top/mnt/pipeline/"
(cd "$top/mnt/pipeline" && gxpc make -j 8 --explain-placement)
gxpc where "$top/mnt/pipeline/reads.fq" "$top/mnt/pipeline/summary.txt"
gxpc stat | head -1
gxpc umount
echo "example: done" >&2
