"""`adaptivespec` command line (filled in as subcommands land)."""


def main(argv=None) -> int:
    raise SystemExit("adaptivespec: no subcommands yet")
