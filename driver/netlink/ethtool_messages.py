"""The ethtool generic-netlink messages the driver speaks, as pyroute2 message classes.

pyroute2 0.9 defines the ethtool header, the verbose bitset and the string-set message
(:mod:`pyroute2.netlink.generic.ethtool`), but no features or private-flags message: those two are
declared here the way pyroute2 declares its own, on its ``genlmsg`` and ``nla`` classes. A bitset
decodes both ways the kernel answers: verbose (named bits) and compact (``VALUE``/``MASK`` as u32
words, bit ``i`` being string ``i`` of the matching string set).

Imported only by :mod:`driver.netlink.ethtool_genl` at its first request: loading pyroute2 costs the
daemon ~8 MB of memory and a noticeable start (docs/performance.md, "pyroute2 or hand-packed
netlink"), which a node whose claims set no ethtool option never pays.
"""

from __future__ import annotations

from pyroute2.netlink import CTRL_CMD_GETFAMILY, GENL_ID_CTRL, NLA_F_NESTED, ctrlmsg, genlmsg, nla
from pyroute2.netlink.generic.ethtool import (
    ETHTOOL_GENL_VERSION,
    ETHTOOL_MSG_FEATURES_GET,
    ETHTOOL_MSG_FEATURES_SET,
    ETHTOOL_MSG_PRIVFLAGS_GET,
    ETHTOOL_MSG_PRIVFLAGS_SET,
    ETHTOOL_MSG_STRSET_GET,
    ethtool_strset_msg,
    ethtoolbitset,
    ethtoolheader,
)

__all__ = [
    "CTRL_CMD_GETFAMILY",
    "ETHTOOL_GENL_VERSION",
    "ETHTOOL_MSG_FEATURES_GET",
    "ETHTOOL_MSG_FEATURES_SET",
    "ETHTOOL_MSG_PRIVFLAGS_GET",
    "ETHTOOL_MSG_PRIVFLAGS_SET",
    "ETHTOOL_MSG_STRSET_GET",
    "GENL_ID_CTRL",
    "bitset",
    "ctrlmsg",
    "ethtool_strset_msg",
    "features_msg",
    "privflags_msg",
]


class bitset(nla):  # noqa: N801 - pyroute2 names its message classes in lower case
    """``ETHTOOL_A_BITSET_*``: pyroute2's verbose bitset, with ``VALUE``/``MASK`` decoded as u32 words."""

    nla_flags = NLA_F_NESTED
    nla_map = (
        ("ETHTOOL_A_BITSET_UNSPEC", "none"),
        ("ETHTOOL_A_BITSET_NOMASK", "flag"),
        ("ETHTOOL_A_BITSET_SIZE", "uint32"),
        ("ETHTOOL_A_BITSET_BITS", "bitset_bits"),
        ("ETHTOOL_A_BITSET_VALUE", "array(uint32)"),
        ("ETHTOOL_A_BITSET_MASK", "array(uint32)"),
    )
    bitset_bits = ethtoolbitset.bitset_bits


class features_msg(genlmsg):  # noqa: N801
    """``ETHTOOL_MSG_FEATURES_GET/SET`` (and the kernel's reply)."""

    nla_map = (
        ("ETHTOOL_A_FEATURES_UNSPEC", "none"),
        ("ETHTOOL_A_FEATURES_HEADER", "ethtoolheader"),
        ("ETHTOOL_A_FEATURES_HW", "bitset"),
        ("ETHTOOL_A_FEATURES_WANTED", "bitset"),
        ("ETHTOOL_A_FEATURES_ACTIVE", "bitset"),
        ("ETHTOOL_A_FEATURES_NOCHANGE", "bitset"),
    )
    ethtoolheader = ethtoolheader
    bitset = bitset


class privflags_msg(genlmsg):  # noqa: N801
    """``ETHTOOL_MSG_PRIVFLAGS_GET/SET`` (and the kernel's reply)."""

    nla_map = (
        ("ETHTOOL_A_PRIVFLAGS_UNSPEC", "none"),
        ("ETHTOOL_A_PRIVFLAGS_HEADER", "ethtoolheader"),
        ("ETHTOOL_A_PRIVFLAGS_FLAGS", "bitset"),
    )
    ethtoolheader = ethtoolheader
    bitset = bitset
