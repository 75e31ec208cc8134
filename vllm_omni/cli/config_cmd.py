"""`vllm-omni config show PATH [--platform P]`: print the merged, validated deploy config."""

from __future__ import annotations

import argparse
import sys

from vllm_omni.config import ConfigError, config_to_yaml, load_deploy_config
from vllm_omni.config.schema import PLATFORMS

EXIT_CONFIG_ERROR = 2


def register(commands: argparse._SubParsersAction) -> None:
    config = commands.add_parser("config", help="inspect deploy configs")
    actions = config.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="print a deploy config after inheritance and platform merge")
    show.add_argument("path", help="deploy YAML file")
    show.add_argument("--platform", choices=PLATFORMS,
                      help="platform whose overrides apply (default: detected)")
    show.set_defaults(run=show_config)


def show_config(args: argparse.Namespace) -> int:
    try:
        config = load_deploy_config(args.path, platform=args.platform)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(config_to_yaml(config), end="")
    return 0
