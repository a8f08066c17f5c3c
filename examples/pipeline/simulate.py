"""Make a reference genome and reads sampled from it (with a few errors),
deterministic for a given seed: python3 simulate.py ref LENGTH > ref.fa,
python3 simulate.py reads ref.fa COUNT > reads.fq."""
import random
import sys


def main() -> None:
    r = random.Random(15)
    if sys.argv[1] == "ref":
        n = int(sys.argv[2])
        seq = "".join(r.choice("ACGT") for _ in range(n))
        print(">chr1")
        for i in range(0, n, 70):
            print(seq[i:i + 70])
        return
    with open(sys.argv[2]) as f:
        ref = "".join(line.strip() for line in f if not line.startswith(">"))
    for i in range(int(sys.argv[3])):
        pos = r.randrange(0, len(ref) - 100)
        read = list(ref[pos:pos + 100])
        for _ in range(2):                       # two sequencing errors a read
            k = r.randrange(40, 100)
            read[k] = r.choice("ACGT")
        print("@read%07d\n%s\n+\n%s" % (i, "".join(read), "I" * 100))


main()
