"""LinkNames: which other names of a hard-linked file must have their kernel
attributes dropped when one of them changes (no mount: the bookkeeping)."""
from sshfsmux.fs.link_names import LinkNames


def test_link_unlink_and_rename_keep_the_groups():
    n = LinkNames()
    assert n.others("/a") == [] and len(n) == 0
    assert n.linked("/a", "/b") == ["/a"]
    assert sorted(n.linked("/b", "/d/c")) == ["/a", "/b"]
    assert sorted(n.others("/a")) == ["/b", "/d/c"]
    # a directory renamed: the names below it move with it
    assert sorted(n.renamed("/d", "/e")) == ["/a", "/b"]
    assert sorted(n.others("/a")) == ["/b", "/e/c"]
    assert n.others("/d/c") == []
    # a rename over a linked name: that name's file loses one
    assert n.linked("/x", "/y") == ["/x"]
    assert sorted(n.renamed("/b", "/y")) == ["/a", "/e/c", "/x"]
    assert sorted(n.others("/y")) == ["/a", "/e/c"] and n.others("/x") == []
    assert sorted(n.removed("/a")) == ["/e/c", "/y"]
    assert n.removed("/y") == ["/e/c"]
    assert n.others("/e/c") == [] and len(n) == 0
