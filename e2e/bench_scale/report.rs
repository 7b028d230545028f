//! The scale benchmark's report: each size's figures beside its target, then the largest
//! size's, as `make bench` prints them (every simulated figure marked).

use super::*;

pub(crate) fn print_report(
    fleet: &LocalFleet,
    real_n: usize,
    idle: Duration,
    figs: &[SizeFigures],
    s: &AtScale,
) {
    println!(
        "scale benchmark: one agent (release build, leader-elected) on a real management kube-apiserver {} (etcd {})",
        fleet.version,
        fleet
            .etcd_version
            .as_deref()
            .unwrap_or("of an unknown version")
    );
    println!(
        "  hosted side: {real_n} REAL kube-apiservers {} with real admission services where a guard needs one; the rest SIMULATED",
        fleet.version
    );
    println!(
        "  (one HTTPS server in the bench, serving what 1.36 serves: real TLS, a CA and SNI name per cluster, no policy compile delay)"
    );
    println!(
        "  {}",
        if env_num("BENCH_SCALE_SERVICE", 0) == 1 {
            "BENCH_SCALE_SERVICE=1: the Service tag on its webhook, so every HCP has an admission service"
        } else {
            "default configuration: where the hosted kube-apiserver serves both admission policy kinds, no HCP has an admission service"
        }
    );
    let limit = AgentConfig::default().management_api;
    let rps = std::env::var("BENCH_SCALE_RPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(limit.requests_per_second);
    println!("  agent's management request ceiling: {rps} per second");
    let col = |f: &dyn Fn(&SizeFigures) -> String| {
        figs.iter()
            // A space before each, so a figure wider than its column does not run into the
            // next.
            .map(|x| format!(" {:>15}", f(x)))
            .collect::<Vec<_>>()
            .join("")
    };
    println!("  {:<52}{}   target", "HCPs", col(&|f| f.n.to_string()));
    // The one target that grows with the fleet (docs/architecture.md's table); the others
    // hold at every size.
    println!(
        "  {:<52}{}   < 60 s at 1,000, < 3 min at 3,000",
        "cold start -> every HCP Compliant",
        col(&|f| secs(f.converge))
    );
    println!(
        "  {:<52}{}",
        "  the real ones",
        col(&|f| secs(f.converge_real))
    );
    println!(
        "  {:<52}{}",
        "  the simulated ones",
        col(&|f| secs(f.converge_sim))
    );
    println!(
        "  {:<52}{}",
        "management requests during it (writes)",
        col(&|f| format!("{:.0} ({:.0})", f.mgmt_converge, f.mgmt_writes_converge))
    );
    println!(
        "  {:<52}{}   <= 12",
        "  per HCP (writes)",
        col(&|f| format!(
            "{:.1} ({:.1})",
            f.mgmt_converge / f.n as f64,
            f.mgmt_writes_converge / f.n as f64
        ))
    );
    println!(
        "  {:<52}{}",
        "  peak writes per second",
        col(&|f| format!("{:.0}", f.peak_writes))
    );
    println!(
        "  {:<52}{}",
        "hosted requests / cluster during it: real",
        col(&|f| format!("{:.1}", f.hosted_converge_real))
    );
    println!(
        "  {:<52}{}",
        "  simulated",
        col(&|f| format!("{:.1}", f.hosted_converge_sim))
    );
    println!(
        "  {:<52}{}   < 20 s",
        "restart over the converged fleet -> all Compliant",
        col(&|f| secs(f.restart))
    );
    println!(
        "  {:<52}{}   < 1",
        "  management writes per HCP (the Lease's apart)",
        col(&|f| format!("{:.2}", f.restart_writes / f.n as f64))
    );
    println!(
        "  {:<52}{}",
        "  management requests per HCP (all, until 5 s after)",
        col(&|f| format!("{:.2}", f.restart_mgmt / f.n as f64))
    );
    println!(
        "  {:<52}{}",
        "  hosted requests / cluster: real",
        col(&|f| format!("{:.1}", f.restart_hosted_real))
    );
    println!(
        "  {:<52}{}",
        "    simulated",
        col(&|f| format!("{:.1}", f.restart_hosted_sim))
    );
    // Whose CPU the restart was: on two cores its wall time is all of theirs together.
    fn cpu_s(ticks: u64) -> String {
        format!("{:.1}", support::cpu_seconds(ticks))
    }
    type Row = (&'static str, fn(&SizeFigures) -> String);
    let cpu: [Row; 5] = [
        ("  its CPU-s: the agent (ms per HCP)", |f| {
            let per_hcp = support::cpu_seconds(f.restart_cpu.agent) * 1e3 / f.n.max(1) as f64;
            format!("{} ({per_hcp:.1})", cpu_s(f.restart_cpu.agent))
        }),
        ("    the SIMULATED clusters (this process)", |f| {
            cpu_s(f.restart_cpu.simulated)
        }),
        ("    the management kube-apiserver", |f| {
            cpu_s(f.restart_cpu.management)
        }),
        ("    the real hosted kube-apiservers, etcd", |f| {
            cpu_s(f.restart_cpu.real)
        }),
        ("    the machine busy (of its CPUs x the restart)", |f| {
            let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
            let whole = cpus as f64 * f.restart.as_secs_f64();
            format!("{} of {whole:.1}", cpu_s(f.restart_cpu.machine))
        }),
    ];
    for (part, figure) in cpu {
        println!("  {:<52}{}", part, col(&figure));
    }
    for f in figs {
        let calls: Vec<String> = f
            .restart_calls
            .iter()
            .map(|(call, n)| format!("{call}: {n}"))
            .collect();
        println!(
            "    one simulated cluster's requests in the restart at {}: {}",
            f.n,
            calls.join(", ")
        );
    }
    println!(
        "  {:<52}{}",
        "admission Deployments, pods (per HCP)",
        col(&|f| format!(
            "{}, {} ({:.2})",
            f.admission_deployments,
            f.admission_pods,
            f.admission_pods as f64 / f.n.max(1) as f64
        ))
    );
    println!(
        "  {:<52}{}",
        "REAL admission pods: processes, RSS, idle CPU",
        col(&|f| format!(
            "{}, {:.1} MiB, {:.2} %",
            f.real_pods,
            f.real_pods_rss_kib as f64 / 1024.0,
            f.real_pods_cpu_pct
        ))
    );
    println!(
        "  {:<52}{}",
        "agent RSS after convergence (peak)",
        col(&|f| format!(
            "{:.1} ({:.0}) MiB",
            f.rss_kib as f64 / 1024.0,
            f.peak_rss_kib as f64 / 1024.0
        ))
    );
    let per_hcp: Vec<String> = figs
        .windows(2)
        .map(|w| {
            let d = w[1].rss_kib as f64 - w[0].rss_kib as f64;
            format!("{:.0} KiB", d / (w[1].n - w[0].n) as f64)
        })
        .collect();
    println!(
        "  {:<52}{:>16}{}   < 150 KiB",
        "RSS per added HCP (growth from the size before)",
        "",
        per_hcp
            .iter()
            .map(|p| format!("{p:>16}"))
            .collect::<String>()
    );
    println!(
        "  {:<52}{}   < 3 %",
        format!("idle CPU over {}s (% of one core)", idle.as_secs()),
        col(&|f| format!("{:.2} %", f.cpu_idle_pct))
    );
    println!(
        "  {:<52}{}   Lease only",
        "idle management requests per minute",
        // A fold from 0.0: `sum` of no f64 is -0.0, which prints as "-0".
        col(&|f| format!("{:.0}", f.mgmt_idle.values().fold(0.0, |a, b| a + b)))
    );
    for f in figs {
        let detail: Vec<String> = f
            .mgmt_idle
            .iter()
            .map(|(k, v)| format!("{k}: {v:.0}"))
            .collect();
        println!("  {:<52}   at {}: {}", "", f.n, detail.join(", "));
    }
    println!(
        "  {:<52}{}   the probes",
        "idle hosted requests / cluster / minute: real",
        col(&|f| format!("{:.2}", f.hosted_idle_real))
    );
    println!(
        "  {:<52}{}",
        "  simulated (agent's count)",
        col(&|f| format!("{:.2}", f.hosted_idle_sim))
    );
    println!(
        "  {:<52}{}",
        "  simulated (the server's count)",
        col(&|f| format!("{:.2}", f.sim_seen_idle))
    );
    println!(
        "  {:<52}{}",
        "uninstall before the next size",
        col(&|f| f.uninstall.map(secs).unwrap_or_else(|| "-".into()))
    );
    let per_hcp = |m: &BTreeMap<String, f64>, n: usize| {
        let mut by: Vec<(&String, &f64)> = m.iter().collect();
        by.sort_by(|a, b| b.1.total_cmp(a.1));
        by.iter()
            .map(|(k, v)| format!("{k} {:.2}", **v / n as f64))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for f in figs {
        println!(
            "  management requests per HCP during the cold start at {}: {}",
            f.n,
            per_hcp(&f.mgmt_converge_by, f.n)
        );
        println!(
            "  management writes per HCP after the restart at {}: {}",
            f.n,
            per_hcp(&f.restart_by, f.n)
        );
    }
    let Some(big) = figs.last() else { return };
    let mut d = s.drift_sim.clone();
    d.sort();
    let mut r = s.drift_real.clone();
    r.sort();
    println!("  at {} HCPs:", big.n);
    println!(
        "  {:<52}p50 {} p99 {} max {} (n={})   p99 < 1 s",
        "  drift repaired, simulated",
        ms(percentile(&d, 50.0)),
        ms(percentile(&d, 99.0)),
        ms(d.last().copied().unwrap_or_default()),
        d.len()
    );
    println!(
        "  {:<52}p50 {} p99 {} max {} (n={})",
        "  drift repaired, real",
        ms(percentile(&r, 50.0)),
        ms(percentile(&r, 99.0)),
        ms(r.last().copied().unwrap_or_default()),
        r.len()
    );
    let mut ns = s.new_sim.clone();
    ns.sort();
    println!(
        "  {:<52}p50 {} max {} (n={})   < 2 s",
        "  new HCP -> Compliant, simulated",
        ms(percentile(&ns, 50.0)),
        ms(ns.last().copied().unwrap_or_default()),
        ns.len()
    );
    println!(
        "  {:<52}{}",
        "  new HCP -> Compliant, real",
        s.new_real
            .iter()
            .map(|d| ms(*d))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  {:<52} all {} (p50 {}; the real ones by {})",
        "  a guard's mode flipped -> every cluster carries it",
        secs(s.config_all),
        secs(percentile(&s.config_each, 50.0)),
        secs(s.config_real_max)
    );
    println!(
        "  {:<52} {:.0}",
        "  peak management writes per second (all of the above)", s.peak_writes
    );
    println!(
        "  {:<52}{} lines in {}: {}",
        "  `hcp-fleet-agent status`",
        s.status_lines,
        ms(s.status_time),
        s.status_summary
    );
    for (label, engine, r) in &s.tenant {
        println!(
            "  {:<52} {engine}: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms ({} requests)",
            format!("  {label}"),
            r.rps,
            r.p50,
            r.p99,
            r.total
        );
    }
}
