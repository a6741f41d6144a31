"""DashInfer 1.3's ConfigManager: the JSON config an EngineHelper is built from.

    {"model_name", "model_type", "model_path", "data_type", "device_type", "device_ids", "multinode_mode",
     "convert_config": {"do_dynamic_quantize_convert"}, "engine_config": {...}, "generation_config": {...},
     "quantization_config": {"activation_type", "weight_type", "SubChannel", "GroupSize"}}

create_config() merges a user's config over the defaults (DashInfer 1.3's values) and checks the
keys an EngineHelper cannot start without; the model_type must be one this runtime serves.
"""
import copy
import json
import os

from ..errors import ModelSerializerException
from ..model.torch_model import check_model_type

DEFAULT_CONFIG = {
    "model_name": "",
    "model_type": "",
    "model_path": "~/dashinfer_models/",
    "data_type": "float32",
    "device_type": "CPU",
    "device_ids": [0],
    "multinode_mode": False,
    "convert_config": {"do_dynamic_quantize_convert": False},
    "engine_config": {"engine_max_length": 2048, "engine_max_batch": 8, "do_profiling": False,
                      "num_threads": 0, "matmul_precision": "medium"},
    "generation_config": {"temperature": 1.0, "early_stopping": True, "top_k": 1024, "top_p": 0.8,
                          "repetition_penalty": 1.1, "presence_penalty": 0.0, "min_length": 0,
                          "max_length": 2048, "no_repeat_ngram_size": 0, "eos_token_id": [],
                          "stop_words_ids": [], "seed": 1234},
    "quantization_config": {"activation_type": "bfloat16", "weight_type": "uint8", "SubChannel": True,
                            "GroupSize": 64},
}


class ConfigManager:
    @staticmethod
    def save_config_as_json(config, file_path):
        with open(file_path, "w") as f:
            json.dump(config, f, indent=4)

    @staticmethod
    def get_config_from_json(file_path):
        if not os.path.exists(file_path):
            raise ValueError(f"File {file_path} doesn't exist.")
        with open(file_path) as f:
            return json.load(f)

    @staticmethod
    def get_default_config():
        return copy.deepcopy(DEFAULT_CONFIG)

    @staticmethod
    def recursive_merge(dict1, dict2):
        """dict2's values over dict1's (in dict1, which is returned), nested dicts merged; None keeps dict1's."""
        for key, value in dict2.items():
            if value is None:
                continue
            if isinstance(dict1.get(key), dict) and isinstance(value, dict):
                dict1[key] = ConfigManager.recursive_merge(dict1[key], value)
            else:
                dict1[key] = value
        return dict1

    @staticmethod
    def check_config(config):
        """ValueError naming the first key an EngineHelper cannot use."""
        name = config.get("model_name")
        if not isinstance(name, str) or not name:
            raise ValueError("config['model_name']: key not exists or unsupported value")
        try:
            check_model_type(config.get("model_type"))
        except ModelSerializerException as e:
            raise ValueError(f"config['model_type']: {e}") from None
        if str(config.get("device_type")).upper() != "CPU":
            raise ValueError(f"config['device_type']: {config.get('device_type')!r} is not supported (only CPU)")
        ids = config.get("device_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise ValueError(f"config['device_ids']: a non-empty list of NUMA node numbers, got {ids!r}")

    @staticmethod
    def create_config(user_config):
        config = ConfigManager.recursive_merge(ConfigManager.get_default_config(), user_config)
        ConfigManager.check_config(config)
        return config
