"""Issue 18: the AWS sandbox refuses access keys it does not know, as AWS does, and the adapter reports that as
``CredentialsRejected``.

AWS's answers to a key it has no record of: EC2 (query protocol) ``AuthFailure``, "The provided credentials could
not be validated" ("Error codes for the Amazon EC2 API",
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html); the JSON-protocol services (the
Price List API, Systems Manager) ``UnrecognizedClientException``, "The most likely cause is an AWS access key ID or
secret key that's not valid" (botocore reference, UnrecognizedClientException,
https://docs.aws.amazon.com/botocore/latest/reference/services/logs/client/exceptions/UnrecognizedClientException.html).
"""

from __future__ import annotations

from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import pytest

from providers.aws.adapter import AwsAdapter
from providers.aws.client import AwsClient, ClientSettings
from providers.errors import CredentialsRejected
from providers.types import Credentials
from sandboxes.aws import keys as aws_keys
from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.launch import DLAMI_PARAMETER
from sandboxes.demo import SANDBOX_ACCOUNTS

# AWS's own documentation example key: well formed, and a key the sandbox has never been given.
DOCUMENTATION_KEY = "AKIAIOSFODNN7EXAMPLE"


def _client(sandbox: AwsSandbox, service: str, key: str) -> Any:
    return boto3.client(
        service,
        region_name="us-east-1",
        endpoint_url=sandbox.url,
        aws_access_key_id=key,
        aws_secret_access_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        config=botocore.config.Config(retries={"total_max_attempts": 1}),
    )


def _refusal(call: Any) -> tuple[str, int]:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    response: Any = caught.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.mark.parametrize("key", [DOCUMENTATION_KEY, aws_keys.UNKNOWN_ACCESS_KEY_ID, "AKIDANYTHING"])
def test_a_key_the_sandbox_does_not_know_is_refused_by_every_service(aws_sandbox: AwsSandbox, key: str) -> None:
    assert _refusal(_client(aws_sandbox, "ec2", key).describe_availability_zones) == ("AuthFailure", 401)
    pricing = _client(aws_sandbox, "pricing", key)
    assert _refusal(lambda: pricing.get_products(ServiceCode="AmazonEC2")) == ("UnrecognizedClientException", 400)
    ssm = _client(aws_sandbox, "ssm", key)
    assert _refusal(lambda: ssm.get_parameter(Name=DLAMI_PARAMETER)) == ("UnrecognizedClientException", 400)


@pytest.mark.parametrize("key", sorted(aws_keys.KNOWN_KEYS))
def test_every_known_key_is_accepted(aws_sandbox: AwsSandbox, key: str) -> None:
    zones = _client(aws_sandbox, "ec2", key).describe_availability_zones()["AvailabilityZones"]
    products = _client(aws_sandbox, "pricing", key).get_products(ServiceCode="AmazonEC2", MaxResults=1)

    assert zones and products["PriceList"]


def test_an_unknown_key_is_credentials_rejected_for_ec2_and_the_price_list(aws_sandbox: AwsSandbox) -> None:
    client = AwsClient(
        ClientSettings(access_key_id=DOCUMENTATION_KEY, secret_access_key="s", endpoint_url=aws_sandbox.url)
    )

    with pytest.raises(CredentialsRejected) as ec2:
        client.call("us-east-1", "describe_availability_zones")
    with pytest.raises(CredentialsRejected) as pricing:
        client.price_list(ServiceCode="AmazonEC2")

    assert (ec2.value.code, ec2.value.http_status) == ("AuthFailure", 401)
    assert (pricing.value.code, pricing.value.http_status) == ("UnrecognizedClientException", 400)


def test_the_adapter_with_an_unknown_key_is_refused_before_any_offer(aws_sandbox: AwsSandbox) -> None:
    credentials = Credentials(
        kind="aws", values={"access_key_id": DOCUMENTATION_KEY, "secret_access_key": "s"}, endpoint_url=aws_sandbox.url
    )
    adapter = AwsAdapter(credentials, ["us-east-1"])

    with pytest.raises(CredentialsRejected):
        adapter.check_credentials()
    with pytest.raises(CredentialsRejected):
        adapter.list_offers()
    assert [c.action for c in aws_sandbox.calls()] == ["DescribeAvailabilityZones", "DescribeInstanceTypes"]


def test_the_demo_account_uses_the_demo_key_and_reaches_the_sandbox(aws_sandbox: AwsSandbox) -> None:
    demo = SANDBOX_ACCOUNTS["aws"](aws_sandbox)

    assert demo.credentials == aws_keys.DEMO.credentials()
    adapter = AwsAdapter(
        Credentials(kind="aws", values=demo.credentials, endpoint_url=demo.endpoint_url), ["us-east-1"]
    )
    adapter.check_credentials()
    assert adapter.list_offers()


def test_an_allow_list_narrows_the_known_keys_until_reset(aws_sandbox: AwsSandbox) -> None:
    aws_sandbox.accept_access_keys({aws_keys.BOB.access_key_id})

    assert _refusal(_client(aws_sandbox, "ec2", aws_keys.ALICE.access_key_id).describe_regions)[0] == "AuthFailure"
    aws_sandbox.reset()
    assert _client(aws_sandbox, "ec2", aws_keys.ALICE.access_key_id).describe_regions()["Regions"]
