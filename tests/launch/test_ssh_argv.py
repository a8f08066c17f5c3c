"""The ssh command line a `use ssh ... -o OPTION` rule gives (channels.py)."""
from gxpstyle.launch.channels import process_argv


def test_an_ssh_option_goes_with_its_dash_o_and_the_host_stays_last():
    argv = process_argv("ssh", "tb01", {"ssh_options": ["ProxyJump=gw", "-oCompression=yes", "-v"]})
    i = argv.index("ProxyJump=gw")
    assert argv[i - 1] == "-o"
    assert "-oCompression=yes" in argv and "-v" in argv
    # the host comes after "--", so no option can be taken for it
    assert argv[argv.index("--") + 1] == "tb01"
