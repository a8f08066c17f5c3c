"""Cut part K of N out of a FASTQ file, reading only that part:
python3 split.py reads.fq K N > partK.fq. Part K holds the records that start
in the Kth N-th of the file's bytes; a part that begins mid-record skips to the
next record (a line starting with "@" whose line two below starts with "+":
a quality line may start with "@", a sequence line never), as Hadoop's input
splits do. Every record lands in exactly one part, in order."""
import os
import sys


def record_start(f, offset: int) -> int:
    """Offset of the first record starting at or after `offset`."""
    if offset == 0:
        return 0
    f.seek(offset - 1)
    pos = offset + len(f.readline()) - 1      # the start of the next whole line
    while True:
        f.seek(pos)
        lines = [f.readline() for _ in range(3)]
        if not lines[0]:
            return pos                          # end of file
        if lines[0].startswith(b"@") and lines[2].startswith(b"+"):
            return pos
        pos += len(lines[0])


def main() -> None:
    path, k, n = sys.argv[1], int(sys.argv[2], 10), int(sys.argv[3], 10)
    if not 1 <= k <= n:
        sys.exit("split.py: part %d is not between 1 and %d" % (k, n))
    size = os.path.getsize(path)
    out = sys.stdout.buffer
    with open(path, "rb") as f:
        start = record_start(f, (k - 1) * size // n)
        end = record_start(f, k * size // n) if k < n else size
        f.seek(start)
        left = end - start
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)


main()
