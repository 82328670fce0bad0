//! Launches one EC2 instance the way LAUNCHING.md asks: ownership and lifetime tags in
//! RunInstances' `TagSpecifications`, so the instance is never untagged for a moment.
//! Prints the instance id on stdout (the demo and tests read it).
//!
//!   cargo run -p fusebox-watchdog --example launch -- \
//!       --endpoint-url http://127.0.0.1:5000 --tenant demo --run research-42 --max-lifetime 3600
//!
//! Credentials and defaults come from the standard AWS chain (against moto_server any
//! non-empty AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY will do).

use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use clap::Parser;

#[derive(Debug, Parser)]
struct Args {
    /// EC2 endpoint override, e.g. http://127.0.0.1:5000 for moto_server.
    #[arg(long)]
    endpoint_url: Option<String>,
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// fusebox:tenant
    #[arg(long)]
    tenant: String,
    /// fusebox:run
    #[arg(long)]
    run: String,
    /// fusebox:max-lifetime, seconds from launch.
    #[arg(long)]
    max_lifetime: Option<u64>,
    /// fusebox:deadline, RFC 3339.
    #[arg(long)]
    deadline: Option<String>,
    /// fusebox:protect=true: the watchdog reports it but never terminates it.
    #[arg(long)]
    protect: bool,
    /// An AMI the endpoint knows (this one is in moto's image list).
    #[arg(long, default_value = "ami-12c6146b")]
    image_id: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(args.region.clone()))
        .load()
        .await;
    let mut conf = aws_sdk_ec2::config::Builder::from(&sdk);
    if let Some(url) = &args.endpoint_url {
        conf = conf.endpoint_url(url);
    }
    let ec2 = aws_sdk_ec2::Client::from_conf(conf.build());

    let mut tags = vec![
        ("fusebox:managed", "true".to_owned()),
        ("fusebox:tenant", args.tenant.clone()),
        ("fusebox:run", args.run.clone()),
    ];
    if let Some(s) = args.max_lifetime {
        tags.push(("fusebox:max-lifetime", s.to_string()));
    }
    if let Some(d) = &args.deadline {
        tags.push(("fusebox:deadline", d.clone()));
    }
    if args.protect {
        tags.push(("fusebox:protect", "true".to_owned()));
    }
    let spec = TagSpecification::builder()
        .resource_type(ResourceType::Instance)
        .set_tags(Some(
            tags.iter()
                .map(|(k, v)| Tag::builder().key(*k).value(v).build())
                .collect(),
        ))
        .build();
    let out = ec2
        .run_instances()
        .image_id(&args.image_id)
        .instance_type(InstanceType::T3Micro)
        .min_count(1)
        .max_count(1)
        .tag_specifications(spec)
        .send()
        .await?;
    let id = out
        .instances()
        .first()
        .and_then(|i| i.instance_id())
        .ok_or("RunInstances answered without an instance id")?;
    println!("{id}");
    Ok(())
}
