"""Role derivation from the PADDLE_* contract and Volcano's variables."""
from __future__ import annotations

import pytest

from runtime.trainer.roles import RoleError, from_env


def test_explicit_paddle_env():
    r = from_env({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.1:8200,10.0.0.2:8200",
                  "PADDLE_TRAINERS_NUM": "3", "PADDLE_TRAINER_ID": "2"})
    assert (r.role, r.trainers, r.trainer_id, r.pservers) == ("TRAINER", 3, 2, ("10.0.0.1:8200", "10.0.0.2:8200"))


def test_volcano_trainer_and_pserver():
    vc = {"VC_PSERVER_HOSTS": "job-pserver-0.job,job-pserver-1.job", "VC_TRAINER_NUM": "2",
          "PADDLE_PORT": "8300"}
    t = from_env({**vc, "TRAINING_ROLE": "TRAINER", "VC_TASK_INDEX": "1"})
    assert t.trainer_id == 1 and t.trainers == 2
    assert t.pservers == ("job-pserver-0.job:8300", "job-pserver-1.job:8300")
    p = from_env({**vc, "TRAINING_ROLE": "PSERVER", "VC_TASK_INDEX": "1"})
    assert p.endpoint == "job-pserver-1.job:8300" and p.env()["POD_IP"] == "job-pserver-1.job"
    # explicit PADDLE_* wins over Volcano's
    t2 = from_env({**vc, "TRAINING_ROLE": "TRAINER", "VC_TASK_INDEX": "1", "PADDLE_TRAINER_ID": "0"})
    assert t2.trainer_id == 0


def test_gloo_store_on_pserver_0_for_every_role():
    vc = {"VC_PSERVER_HOSTS": "job-pserver-0.job,job-pserver-1.job", "VC_TRAINER_NUM": "2"}
    for role in ("TRAINER", "PSERVER"):
        env = from_env({**vc, "TRAINING_ROLE": role, "VC_TASK_INDEX": "1"}).env()
        assert (env["PADDLE_WITH_GLOO"], env["PADDLE_GLOO_RENDEZVOUS"]) == ("1", "3")
        assert env["PADDLE_GLOO_HTTP_ENDPOINT"] == "job-pserver-0.job:8210"
    moved = from_env({**vc, "TRAINING_ROLE": "TRAINER", "VC_TASK_INDEX": "0", "PADDLE_GLOO_PORT": "9000"})
    assert moved.gloo_endpoint == "job-pserver-0.job:9000"
    explicit = from_env({**vc, "TRAINING_ROLE": "TRAINER", "VC_TASK_INDEX": "0",
                         "PADDLE_GLOO_HTTP_ENDPOINT": "10.1.2.3:7000"})
    assert explicit.gloo_endpoint == "10.1.2.3:7000"
    with pytest.raises(RoleError, match="PADDLE_GLOO_HTTP_ENDPOINT"):
        from_env({**vc, "TRAINING_ROLE": "TRAINER", "VC_TASK_INDEX": "0", "PADDLE_GLOO_HTTP_ENDPOINT": "x"})


@pytest.mark.parametrize("env,word", [
    ({}, "TRAINING_ROLE"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINERS_NUM": "1", "PADDLE_TRAINER_ID": "0"}, "PADDLE_PSERVERS_IP_PORT_LIST"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": "h:1", "PADDLE_TRAINER_ID": "0"}, "PADDLE_TRAINERS_NUM"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": "h:1", "PADDLE_TRAINERS_NUM": "2",
      "PADDLE_TRAINER_ID": "2"}, "PADDLE_TRAINER_ID"),
    ({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": "h:1", "PADDLE_TRAINERS_NUM": "2",
      "POD_IP": "other", "PADDLE_PORT": "1"}, "not in"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": "nohostport", "PADDLE_TRAINERS_NUM": "1",
      "PADDLE_TRAINER_ID": "0"}, "host:port"),
])
def test_bad_env_names_the_variable(env, word):
    with pytest.raises(RoleError, match=word):
        from_env(env)
