from setuptools import find_packages, setup

setup(
    name="gxpstyle",
    version="0.1.0",
    description="Explore hosts without preinstall, merged FUSE mounts, and GNU make on the nodes",
    packages=find_packages(include=["gxpstyle", "gxpstyle.*",
                                    "sshfsmux", "sshfsmux.*",
                                    "make_backend", "make_backend.*"]),
    python_requires=">=3.8",
    install_requires=["paramiko>=3.0", "PyYAML>=6.0", "mfusepy>=1.0"],
    # ruff's rules change between 0.x releases; mypy 1.16 is the last release that
    # checks against Python 3.8 (pyproject.toml has both configurations).
    extras_require={"plot": ["matplotlib>=3.3"],
                    "test": ["pytest>=7", "hypothesis>=6", "ruff>=0.17,<0.18", "mypy>=1.16,<1.17"]},
    entry_points={
        "console_scripts": ["gxpc = gxpstyle.gxpc.cli:main", "sshfsm = sshfsmux.standalone.sshfsm:main"],
        # Services the session daemon loads (gxpstyle/api/services.py) and their
        # gxpc verbs (gxpstyle/gxpc/verbs.py): the core never imports these packages.
        "gxpstyle.services": ["gmount = sshfsmux.gmount.service:GMountService",
                              "make = make_backend.head.service:MakeService"],
        "gxpstyle.verbs": ["mount = sshfsmux.gmount.verbs:MOUNT", "umount = sshfsmux.gmount.verbs:UMOUNT",
                           "mw = sshfsmux.gmount.verbs:MW", "make = make_backend.command.verbs:MAKE",
                           "plot = make_backend.command.verbs:PLOT"],
    },
)
