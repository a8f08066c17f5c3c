"""A toy aligner, shaped like BWA's use in a pipeline: index the shared
reference, then place each read by an exact 32-base seed and count mismatches.
python3 align.py ref.fa part.fq > part.sam (SAM-like: name, chr, 1-based
position, mismatches)."""
import sys

SEED = 32


def main() -> None:
    with open(sys.argv[1]) as f:
        ref = "".join(line.strip() for line in f if not line.startswith(">"))
    index = {}
    for i in range(0, len(ref) - SEED + 1):
        index.setdefault(ref[i:i + SEED], i)
    out = sys.stdout
    with open(sys.argv[2]) as f:
        while True:
            name, seq, _, _ = (f.readline().strip() for _ in range(4))
            if not name:
                break
            pos = index.get(seq[:SEED])
            if pos is None:
                out.write("%s\t*\t0\t-1\n" % name[1:])
                continue
            mism = sum(1 for a, b in zip(seq, ref[pos:pos + len(seq)]) if a != b)
            out.write("%s\tchr1\t%d\t%d\n" % (name[1:], pos + 1, mism))


main()
