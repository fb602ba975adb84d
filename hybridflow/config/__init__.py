"""Config loading: strict YAML → dataclasses, no torch or grpc."""

from hybridflow.config.loader import ConfigError, dump_yaml, from_dict, load_config, to_dict

__all__ = ["ConfigError", "dump_yaml", "from_dict", "load_config", "to_dict"]
