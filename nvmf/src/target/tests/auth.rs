//! DH-HMAC-CHAP through the target: the repo's host state machine plays the Linux host
//! (Negotiate, Challenge, Reply, Success1, Success2 over Authentication Send/Receive on
//! every queue) against [`Target`] with simulated time.

use super::*;
use crate::auth::ctrl::{DhWork, Policy, Secrets};
use crate::auth::host::{HostConfig, HostTransaction};
use crate::auth::key::DhchapKey;
use crate::auth::msg::AuthCommand;
use crate::auth::{DhGroup, FailureReason, HashId, CONNECT_AUTHREQ_ATR};

fn key(fill: u8) -> DhchapKey {
    DhchapKey::from_bytes(Some(HashId::Sha256), &[fill; 32]).unwrap()
}

fn creds(host: u8, ctrl: Option<u8>) -> HostCredentials {
    HostCredentials {
        secrets: Secrets {
            host: key(host),
            ctrl: ctrl.map(key),
        },
        policy: Policy::default(),
    }
}

fn seeded(seed: u64) -> Box<dyn crate::auth::Entropy + Send> {
    let mut n = seed;
    Box::new(move |buf: &mut [u8]| {
        for b in buf.iter_mut() {
            n = n
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (n >> 33) as u8;
        }
    })
}

/// SUB1 allows HOST1 (with credentials: host secret 0x11, controller secret 0x22).
fn auth_target() -> Target {
    let mut t = target();
    t.set_entropy(seeded(7));
    t.set_host_credentials([(HOST1.to_string(), creds(0x11, Some(0x22)))]);
    t
}

/// Admin Connect; returns the conversation and the raw Connect DW0.
fn connect_raw(t: Target, subnqn: &str, hostnqn: &str) -> (Conv, u32) {
    connect_kato(t, subnqn, hostnqn, 5000)
}

fn connect_kato(t: Target, subnqn: &str, hostnqn: &str, kato: u32) -> (Conv, u32) {
    let mut c = Conv {
        t,
        now: Instant::now(),
        admin: QueueRef { cntlid: 0, qid: 0 },
        cid: 0,
    };
    let (cqe, ok) = c.t.connect(
        c.now,
        100,
        &origin(),
        &connect_sqe(0, 31, kato),
        &connect_data(0xffff, subnqn, hostnqn),
    );
    assert_eq!(cqe.status(), Status::SUCCESS);
    let ok = ok.unwrap();
    assert_eq!(cqe.dw0 & 0xffff, ok.cntlid as u32);
    c.admin = ok.queue();
    (c, cqe.dw0)
}

/// An Authentication Send; one the target holds for DH work gets its work run (as the
/// daemon's DH thread would) and returns the completion that work released.
fn send(c: &mut Conv, q: QueueRef, payload: &[u8]) -> Cqe {
    let sqe = AuthCommand::dhchap(payload.len() as u32).to_sqe(0, true);
    let mut buf = payload.to_vec();
    match c.exec_on(q, sqe, &mut buf) {
        Outcome::Complete { cqe, data_len } => {
            assert_eq!(data_len, 0);
            assert!(
                c.t.take_dh_jobs().is_empty(),
                "work left for a completed Send"
            );
            cqe
        }
        Outcome::Deferred => {
            let jobs = c.t.take_dh_jobs();
            assert_eq!(jobs.len(), 1, "a held Send leaves one DH job");
            let job = jobs.into_iter().next().unwrap();
            assert!(c.t.dh_wanted(&job.id));
            let done = job.work.run(&mut *seeded(11));
            let actions = c.t.dh_done(job.id, done, c.now);
            // (Actions left from before this Send may come along.)
            let held = actions.iter().filter_map(|a| match a {
                Action::CompleteHeld { queue, cqe, .. } if *queue == q => Some(*cqe),
                _ => None,
            });
            match held.collect::<Vec<_>>()[..] {
                [cqe] => cqe,
                _ => panic!("{actions:?}"),
            }
        }
        o => panic!("{o:?}"),
    }
}

/// HOST1's AUTH_Negotiate (its key 0x11) for `subnqn`, transaction `t_id`.
fn negotiate_to(subnqn: &str, t_id: u16) -> Vec<u8> {
    let cfg = HostConfig::new(HOST1, subnqn, key(0x11), None);
    HostTransaction::new(cfg, t_id).negotiate()
}

fn receive(c: &mut Conv, q: QueueRef) -> (Cqe, Vec<u8>) {
    let sqe = AuthCommand::dhchap(4096).to_sqe(0, false);
    let mut buf = vec![0xa5u8; 4096];
    match c.exec_on(q, sqe, &mut buf) {
        Outcome::Complete { cqe, data_len } => {
            buf.truncate(data_len as usize);
            (cqe, buf)
        }
        o => panic!("{o:?}"),
    }
}

/// Runs the host side on queue `q`; Ok when the host is satisfied.
fn authenticate(
    c: &mut Conv,
    q: QueueRef,
    host_key: u8,
    ctrl_key: Option<u8>,
    t_id: u16,
) -> Result<(), crate::auth::host::HostError> {
    let cfg = HostConfig::new(HOST1, SUB1, key(host_key), ctrl_key.map(key));
    let mut h = HostTransaction::new(cfg, t_id);
    let mut e = seeded(99 + t_id as u64);
    assert!(send(c, q, &h.negotiate()).status().is_success());
    let (cqe, chal) = receive(c, q);
    assert!(cqe.status().is_success());
    let reply = h.on_challenge(&chal, &mut *e)?;
    assert!(send(c, q, &reply).status().is_success());
    let (cqe, s1) = receive(c, q);
    assert!(cqe.status().is_success());
    match h.on_success1(&s1) {
        Ok(Some(s2)) => {
            assert!(send(c, q, &s2).status().is_success());
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => {
            if let Some(r) = e.failure2_reason() {
                send(c, q, &h.failure2(r));
            }
            Err(e)
        }
    }
}

fn refusals(t: &mut Target) -> Vec<Refusal> {
    t.take_notices()
        .0
        .into_iter()
        .filter_map(|n| match n {
            Notice::Refused(r) => Some(r),
            _ => None,
        })
        .collect()
}

#[test]
fn every_queue_authenticates_before_anything_else() {
    let (mut c, dw0) = connect_raw(auth_target(), SUB1, HOST1);
    assert_eq!(dw0 & CONNECT_AUTHREQ_ATR, CONNECT_AUTHREQ_ATR);
    // Nothing but authentication: Property Get is refused, and said so.
    let cqe = c.property_get(fabrics::property::CAP, true);
    assert_eq!(cqe.status(), Status::AUTHENTICATION_REQUIRED);
    let r = refusals(&mut c.t);
    assert!(matches!(
        r.as_slice(),
        [Refusal {
            reason: RefusalReason::AuthenticationRequired { opcode: 0x7f },
            ..
        }]
    ));
    let admin = c.admin;
    authenticate(&mut c, admin, 0x11, Some(0x22), 1).unwrap();
    let notices = c.t.take_notices().0;
    assert!(
        matches!(
            notices.as_slice(),
            [Notice::Authenticated(Authenticated {
                qid: 0,
                bidirectional: true,
                hash: HashId::Sha256,
                dhgroup: DhGroup::Ffdhe2048,
                ..
            })]
        ),
        "{notices:?}"
    );
    assert!(c.property_set(CC_ENABLE).0.status().is_success());
    // The I/O queue gets ATR too and must authenticate on its own.
    let (cqe, ok) = c.io_connect(1, 201);
    assert!(cqe.status().is_success());
    assert!(ok.as_ref().unwrap().authentication_required);
    assert_eq!(cqe.dw0 & CONNECT_AUTHREQ_ATR, CONNECT_AUTHREQ_ATR);
    let io = ok.unwrap().queue();
    let mut buf = vec![0u8; 4096];
    let read = Sqe {
        nsid: 1,
        ..admin_sqe(io::READ, 1)
    };
    match c.exec_on(io, read, &mut buf) {
        Outcome::Complete { cqe, .. } => {
            assert_eq!(cqe.status(), Status::AUTHENTICATION_REQUIRED)
        }
        o => panic!("{o:?}"),
    }
    authenticate(&mut c, io, 0x11, None, 2).unwrap();
    match c.exec_on(io, read, &mut buf) {
        // Past authentication: the slow path's answer for an unattached namespace.
        Outcome::Complete { cqe, .. } => assert_eq!(cqe.status(), Status::NAMESPACE_NOT_READY),
        o => panic!("{o:?}"),
    }
}

#[test]
fn wrong_secret_destroys_the_controller_and_names_the_reason() {
    let (mut c, _) = connect_raw(auth_target(), SUB1, HOST1);
    let admin = c.admin;
    let err = authenticate(&mut c, admin, 0x99, None, 1).unwrap_err();
    assert_eq!(
        err,
        crate::auth::host::HostError::Refused(FailureReason::Failed)
    );
    let r = refusals(&mut c.t);
    assert!(
        matches!(
            r.as_slice(),
            [Refusal { reason: RefusalReason::AuthenticationFailed { reason: FailureReason::Failed, by_host: false }, hostnqn: Some(h), .. }] if h == HOST1
        ),
        "{r:?}"
    );
    assert!(r[0].reason.to_string().contains("wrong secret"));
    assert_eq!(
        c.t.take_actions(),
        vec![Action::Disconnect {
            queue: admin,
            key: 100
        }]
    );
    let mut buf = vec![0u8; 64];
    assert_eq!(
        c.exec_on(admin, admin_sqe(admin::KEEP_ALIVE, 0), &mut buf),
        Outcome::Dropped
    );
}

#[test]
fn host_rejecting_our_response_is_reported_as_its_failure() {
    let (mut c, _) = connect_raw(auth_target(), SUB1, HOST1);
    let admin = c.admin;
    // The host holds another controller secret than ours.
    let err = authenticate(&mut c, admin, 0x11, Some(0x33), 1).unwrap_err();
    assert_eq!(
        err,
        crate::auth::host::HostError::ControllerNotAuthenticated
    );
    let r = refusals(&mut c.t);
    assert!(matches!(
        r.as_slice(),
        [Refusal {
            reason: RefusalReason::AuthenticationFailed { by_host: true, .. },
            ..
        }]
    ));
}

#[test]
fn subsystem_requiring_auth_refuses_hosts_without_credentials() {
    let mut t = auth_target();
    t.add_subsystem(subsystem(SUB2, &[HOST1, HOST2])).unwrap();
    t.set_subsystem_auth_required(SUB2, true);
    let now = Instant::now();
    let (cqe, ok) = t.connect(
        now,
        5,
        &origin(),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB2, HOST2),
    );
    assert!(ok.is_none());
    assert_eq!(cqe.status(), Status::CONNECT_INVALID_HOST);
    let r = refusals(&mut t);
    assert_eq!(r[0].reason, RefusalReason::NoCredentials);
    assert_eq!(r[0].hostnqn.as_deref(), Some(HOST2));
    // HOST1 has credentials: it connects and must authenticate.
    let (_, ok) = t.connect(
        now,
        6,
        &origin(),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB2, HOST1),
    );
    assert!(ok.unwrap().authentication_required);
    // A subsystem that does not require it lets a host without credentials in, with no
    // authentication.
    t.set_subsystem_auth_required(SUB2, false);
    let (_, ok) = t.connect(
        now,
        7,
        &origin(),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB2, HOST2),
    );
    assert!(!ok.unwrap().authentication_required);
}

#[test]
fn discovery_never_asks_for_authentication() {
    let (mut c, dw0) = connect_raw(auth_target(), DISCOVERY_NQN, HOST1);
    assert_eq!(dw0 & CONNECT_AUTHREQ_ATR, 0);
    assert!(c
        .property_get(fabrics::property::CAP, true)
        .status()
        .is_success());
}

#[test]
fn unauthenticated_queue_times_out() {
    let (mut c, _) = connect_kato(auth_target(), SUB1, HOST1, 0);
    let deadline = c.t.next_timeout().unwrap();
    assert!(deadline <= c.now + AUTH_TIMEOUT);
    assert!(c
        .t
        .poll_timeouts(c.now + AUTH_TIMEOUT - Duration::from_millis(1))
        .is_empty());
    let actions = c.t.poll_timeouts(c.now + AUTH_TIMEOUT);
    assert_eq!(
        actions,
        vec![Action::Disconnect {
            queue: c.admin,
            key: 100
        }]
    );
    let r = refusals(&mut c.t);
    assert!(matches!(
        r.as_slice(),
        [Refusal {
            reason: RefusalReason::AuthenticationTimeout { secs: 30 },
            ..
        }]
    ));
    // Authenticated queues have no such deadline (KATO 5 s is the next one).
    let (mut c, _) = connect_raw(auth_target(), SUB1, HOST1);
    let admin = c.admin;
    authenticate(&mut c, admin, 0x11, None, 1).unwrap();
    assert_eq!(
        c.t.next_timeout(),
        Some(c.now + Duration::from_millis(5000))
    );
}

#[test]
fn host_leaving_without_authenticating_is_reported() {
    let (mut c, _) = connect_raw(auth_target(), SUB1, HOST1);
    c.t.queue_closed(c.admin, 100);
    let r = refusals(&mut c.t);
    assert_eq!(r[0].reason, RefusalReason::AuthenticationAbandoned);
    assert_eq!(r[0].hostnqn.as_deref(), Some(HOST1));
}

/// Re-authentication on a live admin queue, and a reload that rotates the host's
/// secret: the old secret no longer works for the next transaction, the new one does.
#[test]
fn reauthentication_and_rotation() {
    let (mut c, _) = connect_raw(auth_target(), SUB1, HOST1);
    let admin = c.admin;
    authenticate(&mut c, admin, 0x11, None, 1).unwrap();
    assert!(c.property_set(CC_ENABLE).0.status().is_success());
    authenticate(&mut c, admin, 0x11, Some(0x22), 2).unwrap();
    // A key rotation may bring re-authentications back to back: REAUTH_BURST of them
    // within REAUTH_WINDOW are served; the next is refused (each costs a DH key pair),
    // the queue stays, and it is no strike against the address.
    for t_id in 10..10 + authn::REAUTH_BURST as u16 - 1 {
        authenticate(&mut c, admin, 0x11, None, t_id).unwrap();
    }
    let cqe = send(&mut c, admin, &negotiate_to(SUB1, 9));
    assert_eq!(cqe.status(), Status::COMMAND_INTERRUPTED);
    assert!(refusals(&mut c.t).iter().any(|r| r.reason
        == RefusalReason::ReauthenticationTooSoon {
            count: authn::REAUTH_BURST,
            secs: authn::REAUTH_WINDOW.as_secs()
        }));
    assert!(c
        .property_get(fabrics::property::CSTS, false)
        .status()
        .is_success());
    c.now += authn::REAUTH_WINDOW;
    c.t.set_host_credentials([(HOST1.to_string(), creds(0x44, None))]);
    // Still running on the old authentication.
    assert!(c
        .property_get(fabrics::property::CSTS, false)
        .status()
        .is_success());
    authenticate(&mut c, admin, 0x44, None, 3).unwrap();
    assert!(authenticate(&mut c, admin, 0x11, None, 4).is_err());
    assert!(refusals(&mut c.t)
        .iter()
        .any(|r| matches!(r.reason, RefusalReason::AuthenticationFailed { .. })));
}

#[test]
fn bad_authentication_commands() {
    let (mut c, _) = connect_raw(auth_target(), SUB1, HOST1);
    let admin = c.admin;
    let mut buf = vec![0u8; 128];
    let mut sqe = AuthCommand::dhchap(72).to_sqe(0, true);
    sqe.cdw10 = (sqe.cdw10 & 0x00ff_ffff) | 0xea << 24;
    match c.exec_on(admin, sqe, &mut buf) {
        Outcome::Complete { cqe, .. } => assert_eq!(cqe.status(), Status::INVALID_FIELD),
        o => panic!("{o:?}"),
    }
    // TL 0, and TL longer than the data that came.
    for tl in [0u32, 4096] {
        let sqe = AuthCommand::dhchap(tl).to_sqe(0, true);
        match c.exec_on(admin, sqe, &mut buf) {
            Outcome::Complete { cqe, .. } => assert!(!cqe.status().is_success()),
            o => panic!("{o:?}"),
        }
    }
    // A host without credentials on a subsystem that does not need them: the commands
    // are refused, nothing is torn down.
    let mut t = auth_target();
    t.add_subsystem(subsystem(SUB2, &[])).unwrap();
    let (mut c, dw0) = connect_raw(t, SUB2, HOST2);
    assert_eq!(dw0 & CONNECT_AUTHREQ_ATR, 0);
    let admin = c.admin;
    let cqe = send(&mut c, admin, &[0u8; 72]);
    assert_eq!(cqe.status(), Status::INVALID_FIELD);
    assert!(c
        .property_get(fabrics::property::CAP, true)
        .status()
        .is_success());
}

/// No entropy source: Authentication Receive fails with Internal Error rather than
/// issuing a predictable challenge.
#[test]
fn no_entropy_no_challenge() {
    let mut t = target();
    t.set_host_credentials([(HOST1.to_string(), creds(1, None))]);
    let (mut c, _) = connect_raw(t, SUB1, HOST1);
    let admin = c.admin;
    let h = HostTransaction::new(HostConfig::new(HOST1, SUB1, key(1), None), 1);
    assert!(send(&mut c, admin, &h.negotiate()).status().is_success());
    let (cqe, _) = receive(&mut c, admin);
    assert_eq!(cqe.status(), Status::INTERNAL_ERROR);
}

/// TLS listeners in the discovery log: SECTYPE TLS 1.3 and TREQ required / not
/// required (nvmet's values); plain TCP and RDMA listeners unchanged; GENCTR moves.
#[test]
fn discovery_log_publishes_listener_tls() {
    let mut t = target();
    t.add_listener(rdma());
    let tls_l = ListenerInfo {
        port: 4421,
        ..tcp()
    };
    t.add_listener(tls_l.clone());
    t.set_listener_tls(&tls_l, ListenerTls::Required);
    let mut c = Conv::enabled(t, DISCOVERY_NQN, HOST1);
    let (h1, e) = discovery_log(&mut c);
    let by_port = |e: &[DiscoveryLogEntry], port: &[u8], sub: u8| {
        e.iter()
            .find(|x| {
                x.trsvcid.starts_with(port) && x.subtype == sub && x.trtype == disc::TRTYPE_TCP
            })
            .copied()
            .unwrap()
    };
    for sub in [disc::SUBTYPE_NVME, disc::SUBTYPE_CURRENT_DISCOVERY] {
        let plain = by_port(&e, b"4420", sub);
        assert_eq!(plain.tsas[0], disc::TCP_SECTYPE_NONE);
        assert_eq!(plain.treq & 3, disc::TREQ_SECURE_CHANNEL_NOT_SPECIFIED);
        let tls = by_port(&e, b"4421", sub);
        assert_eq!(tls.tsas[0], disc::TCP_SECTYPE_TLS13);
        assert_eq!(tls.treq & 3, disc::TREQ_SECURE_CHANNEL_REQUIRED);
        assert_ne!(tls.treq & disc::TREQ_DISABLE_SQ_FLOW, 0);
    }
    c.t.set_listener_tls(&tls_l, ListenerTls::Optional);
    let (h2, e) = discovery_log(&mut c);
    assert!(h2.genctr.get() > h1.genctr.get());
    let tls = by_port(&e, b"4421", disc::SUBTYPE_NVME);
    assert_eq!(tls.treq & 3, disc::TREQ_SECURE_CHANNEL_NOT_REQUIRED);
    assert_eq!(tls.tsas[0], disc::TCP_SECTYPE_TLS13);
}

/// One log with both: TLS listeners keep their SECTYPE/TREQ and a referral (whose TLS
/// the config does not know) is published "not specified", whichever is set first.
#[test]
fn discovery_log_carries_tls_listeners_and_referrals() {
    let mut t = target();
    let tls_l = ListenerInfo {
        port: 4421,
        ..tcp()
    };
    t.add_listener(tls_l.clone());
    t.set_listener_tls(&tls_l, ListenerTls::Required);
    let mut c = Conv::enabled(t, DISCOVERY_NQN, HOST1);
    let (h1, _) = discovery_log(&mut c);
    c.t.set_referrals(vec![Referral {
        transport: Transport::Tcp,
        addr: "192.0.2.7".parse().unwrap(),
        port: 8009,
    }]);
    let (h2, e) = discovery_log(&mut c);
    assert!(h2.genctr.get() > h1.genctr.get());
    assert_eq!(h2.numrec.get(), e.len() as u64);
    let referral = |e: &[DiscoveryLogEntry]| {
        let r: Vec<_> = e
            .iter()
            .filter(|x| x.subtype == disc::SUBTYPE_REFERRAL)
            .copied()
            .collect();
        assert_eq!(r.len(), 1);
        r[0]
    };
    let r = referral(&e);
    assert_eq!(&r.traddr[..9], b"192.0.2.7");
    assert_eq!(&r.trsvcid[..4], b"8009");
    assert_eq!(r.tsas[0], disc::TCP_SECTYPE_NONE);
    assert_eq!(r.treq & 3, disc::TREQ_SECURE_CHANNEL_NOT_SPECIFIED);
    let tls_entries: Vec<_> = e
        .iter()
        .filter(|x| x.trsvcid.starts_with(b"4421"))
        .collect();
    // The subsystem entry and the current discovery entry of the TLS listener.
    assert_eq!(tls_entries.len(), 2);
    for x in tls_entries {
        assert_eq!(x.tsas[0], disc::TCP_SECTYPE_TLS13);
        assert_eq!(x.treq & 3, disc::TREQ_SECURE_CHANNEL_REQUIRED);
    }
    // TLS changed after the referral: both still there, the referral untouched.
    c.t.set_listener_tls(&tls_l, ListenerTls::Optional);
    let (h3, e) = discovery_log(&mut c);
    assert!(h3.genctr.get() > h2.genctr.get());
    assert_eq!(referral(&e), r);
    let tls = e
        .iter()
        .find(|x| x.trsvcid.starts_with(b"4421") && x.subtype == disc::SUBTYPE_NVME)
        .unwrap();
    assert_eq!(tls.treq & 3, disc::TREQ_SECURE_CHANNEL_NOT_REQUIRED);
    assert_eq!(tls.tsas[0], disc::TCP_SECTYPE_TLS13);
}

/// A queue that came over TLS with HOST1's PSK for SUB1 can connect as HOST1 to SUB1
/// only.
#[test]
fn tls_psk_binds_host_and_subsystem() {
    let mut t = target();
    t.add_subsystem(subsystem(SUB2, &[])).unwrap();
    let now = Instant::now();
    let peer = TlsPeer {
        identity: format!("NVMe0R01 {HOST1} {SUB1}"),
        hostnqn: HOST1.into(),
        subnqn: SUB1.into(),
        generated: false,
    };
    for (key, sub, host, ok) in [
        (1, SUB1, HOST2, false),
        (2, SUB2, HOST1, false),
        (3, SUB1, HOST1, true),
    ] {
        t.set_queue_tls(key, peer.clone());
        let (cqe, c) = t.connect(
            now,
            key,
            &origin(),
            &connect_sqe(0, 31, 0),
            &connect_data(0xffff, sub, host),
        );
        assert_eq!(c.is_some(), ok, "{sub} {host}");
        if !ok {
            assert_eq!(cqe.status(), Status::CONNECT_INVALID_HOST);
            let r = refusals(&mut t);
            assert!(matches!(
                &r[0].reason,
                RefusalReason::TlsIdentityMismatch { identity } if identity.starts_with("NVMe0R01 ")
            ));
        }
    }
    // A plain queue is not affected.
    let (_, c) = t.connect(
        now,
        4,
        &origin(),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB2, HOST2),
    );
    assert!(c.is_some());
}

/// Secure channel concatenation (TP 8018): DH-HMAC-CHAP on a plain admin queue asking for
/// a new TLS PSK yields the same `NVMe1G..` identity and key on both sides; a queue that
/// comes back over TLS with it connects without authenticating again; I/O queues cannot
/// ask for concatenation.
#[test]
fn secure_channel_concatenation() {
    use crate::auth::sc_c;
    use crate::auth::tls::TlsPsk;
    let (mut c, _) = connect_raw(auth_target(), SUB1, HOST1);
    let admin = c.admin;
    let mut cfg = HostConfig::new(HOST1, SUB1, key(0x11), None);
    cfg.sc_c = sc_c::NEWTLSPSK;
    let mut h = HostTransaction::new(cfg.clone(), 9);
    let mut e = seeded(5);
    assert!(send(&mut c, admin, &h.negotiate()).status().is_success());
    let (_, chal) = receive(&mut c, admin);
    let reply = h.on_challenge(&chal, &mut *e).unwrap();
    send(&mut c, admin, &reply);
    let (_, s1) = receive(&mut c, admin);
    assert_eq!(h.on_success1(&s1).unwrap(), None);
    let (hash, input) = h.generated_psk().unwrap();
    // SHA-512 is never chosen for concatenation (no TLS PSK derivation for it).
    assert_ne!(hash, HashId::Sha512);
    let host_psk = TlsPsk::v1(hash, &input, HOST1, SUB1, true);
    let g =
        c.t.take_notices()
            .0
            .into_iter()
            .find_map(|n| match n {
                Notice::GeneratedPsk(g) => Some(g),
                _ => None,
            })
            .expect("a generated PSK notice");
    assert_eq!(g.psk.identity, host_psk.identity);
    assert!(g.psk.identity.starts_with("NVMe1G0"));
    assert_eq!(*g.psk.key, *host_psk.key);
    // The host reconnects over TLS with it: no ATR, commands run at once.
    c.t.set_queue_tls(
        300,
        TlsPeer {
            identity: g.psk.identity.clone(),
            hostnqn: HOST1.into(),
            subnqn: SUB1.into(),
            generated: true,
        },
    );
    let (cqe, ok) = c.t.connect(
        c.now,
        300,
        &origin(),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB1, HOST1),
    );
    assert_eq!(cqe.dw0 & CONNECT_AUTHREQ_ATR, 0);
    assert!(!ok.unwrap().authentication_required);

    // Concatenation asked on an I/O queue: Concatenation Mismatch.
    let (mut c, _) = connect_raw(auth_target(), SUB1, HOST1);
    let admin = c.admin;
    authenticate(&mut c, admin, 0x11, None, 1).unwrap();
    assert!(c.property_set(CC_ENABLE).0.status().is_success());
    let (_, ok) = c.io_connect(1, 201);
    let io = ok.unwrap().queue();
    let h = HostTransaction::new(cfg, 3);
    send(&mut c, io, &h.negotiate());
    let (_, m) = receive(&mut c, io);
    assert_eq!((m[1], m[7]), (0xf1, FailureReason::ConcatMismatch.code()));
}

/// An Authentication Receive with an allocation length below the smallest answer (8
/// bytes) after a failed Send is an error status, not a crash (found by fuzzing).
#[test]
fn tiny_allocation_length() {
    let (mut c, _) = connect_raw(auth_target(), SUB1, HOST1);
    let admin = c.admin;
    send(&mut c, admin, &[0xff; 16]);
    for al in [1u32, 7] {
        let sqe = AuthCommand::dhchap(al).to_sqe(0, false);
        let mut buf = vec![0u8; al as usize];
        match c.exec_on(admin, sqe, &mut buf) {
            Outcome::Complete { cqe, .. } => assert_eq!(cqe.status(), Status::INVALID_FIELD),
            o => panic!("{o:?}"),
        }
    }
    let (cqe, m) = receive(&mut c, admin);
    assert!(cqe.status().is_success());
    assert_eq!(m[1], 0xf1);
}

/// Admin Connect to SUB1 as HOST1 from host address `peer`, on queue `key`.
fn connect_from(t: Target, peer: &str, key: QueueKey, now: Instant) -> Conv {
    connect_from_kato(t, peer, key, now, 5000)
}

fn connect_from_kato(t: Target, peer: &str, key: QueueKey, now: Instant, kato: u32) -> Conv {
    connect_to(t, peer, key, now, kato, SUB1)
}

/// HOST1's admin queue to `subnqn` from `peer`.
fn connect_to(t: Target, peer: &str, key: QueueKey, now: Instant, kato: u32, subnqn: &str) -> Conv {
    let mut c = Conv {
        t,
        now,
        admin: QueueRef { cntlid: 0, qid: 0 },
        cid: 0,
    };
    let from = QueueOrigin {
        peer: Some(peer.parse().unwrap()),
        ..origin()
    };
    let (cqe, ok) = c.t.connect(
        c.now,
        key,
        &from,
        &connect_sqe(0, 31, kato),
        &connect_data(0xffff, subnqn, HOST1),
    );
    assert_eq!(cqe.status(), Status::SUCCESS);
    c.admin = ok.unwrap().queue();
    c
}

/// An address that begins and drops [`authn::AUTH_STRIKES`] authentications (a peer that
/// knows an allowed host NQN but not its secret, making the target work at each) gets
/// its next one refused at its first message, with no DH work, while another address
/// authenticates; the strikes age out after [`authn::STRIKE_WINDOW`].
#[test]
fn an_address_that_keeps_abandoning_authentication_is_throttled() {
    let bad = "10.0.0.66";
    let negotiate = || negotiate_to(SUB1, 1);
    let now = Instant::now();
    // A controller of that address that authenticated before the strikes.
    let mut early = connect_from(auth_target(), bad, 900, now);
    let early_admin = early.admin;
    authenticate(&mut early, early_admin, 0x11, Some(0x22), 1).unwrap();
    assert!(early.property_set(CC_ENABLE).0.status().is_success());
    let mut t = early.t;
    for k in 0..authn::AUTH_STRIKES as u64 {
        let mut c = connect_from(t, bad, 1000 + k, now);
        let admin = c.admin;
        assert!(send(&mut c, admin, &negotiate()).status().is_success());
        c.t.queue_closed(admin, 1000 + k);
        assert_eq!(
            refusals(&mut c.t)[0].reason,
            RefusalReason::AuthenticationAbandoned
        );
        t = c.t;
    }
    // The next transaction from that address: refused at its Negotiate.
    let mut c = connect_from(t, bad, 2000, now);
    let admin = c.admin;
    let cqe = send(&mut c, admin, &negotiate());
    assert_eq!(cqe.status(), Status::COMMAND_INTERRUPTED);
    let r = refusals(&mut c.t);
    assert_eq!(
        r[0].reason,
        RefusalReason::AuthenticationThrottled {
            strikes: authn::AUTH_STRIKES,
            under_way: 0,
            secs: authn::STRIKE_WINDOW.as_secs()
        }
    );
    // The controller that had authenticated: its re-authentication is refused, but it
    // is not torn down (it proved the secret).
    let mut early = Conv {
        t: c.t,
        now,
        admin: early_admin,
        cid: 0,
    };
    let cqe = send(&mut early, early_admin, &negotiate());
    assert_eq!(cqe.status(), Status::COMMAND_INTERRUPTED);
    assert!(early
        .property_get(fabrics::property::CSTS, false)
        .status()
        .is_success());
    let c = early;
    // Another address is not held back.
    let mut c = connect_from(c.t, "10.0.0.77", 2001, now);
    let admin = c.admin;
    authenticate(&mut c, admin, 0x11, Some(0x22), 1).unwrap();
    // Closing before any Negotiate (a host without a secret gives up so) is no strike.
    let mut t = c.t;
    for k in 0..authn::AUTH_STRIKES as u64 + 4 {
        let mut c = connect_from(t, "10.0.0.88", 3000 + k, now);
        let admin = c.admin;
        c.t.queue_closed(admin, 3000 + k);
        t = c.t;
    }
    let mut c = connect_from(t, "10.0.0.88", 3100, now);
    let admin = c.admin;
    authenticate(&mut c, admin, 0x11, Some(0x22), 1).unwrap();
    // The strikes age out: a minute later the address may try again.
    let later = now + authn::STRIKE_WINDOW;
    let mut c = connect_from(c.t, bad, 2002, later);
    let admin = c.admin;
    authenticate(&mut c, admin, 0x11, Some(0x22), 1).unwrap();
}

/// A transaction begun and dropped on a discovery controller (which requires no
/// authentication, but serves one to a host with a secret: the same DH work) counts
/// against the address like one on an I/O subsystem's admin queue.
#[test]
fn abandoning_authentication_on_a_discovery_controller_is_a_strike() {
    let bad = "10.0.0.67";
    let negotiate = || negotiate_to(DISCOVERY_NQN, 1);
    let discovery =
        |t: Target, k: QueueKey| connect_to(t, bad, k, Instant::now(), 0, DISCOVERY_NQN);
    let mut t = auth_target();
    for k in 0..authn::AUTH_STRIKES as u64 {
        let mut c = discovery(t, 1000 + k);
        let admin = c.admin;
        assert!(send(&mut c, admin, &negotiate()).status().is_success());
        c.t.queue_closed(admin, 1000 + k);
        t = c.t;
    }
    let mut c = discovery(t, 2000);
    let admin = c.admin;
    assert_eq!(
        send(&mut c, admin, &negotiate()).status(),
        Status::COMMAND_INTERRUPTED
    );
}

/// A transaction left to time out on a queue that may stay (a discovery controller's)
/// counts as one abandoned too: without it a peer could begin one, let it time out and
/// begin the next, forever, on one connection.
#[test]
fn a_transaction_left_to_time_out_on_discovery_is_a_strike() {
    let bad = "10.0.0.68";
    let negotiate = || negotiate_to(DISCOVERY_NQN, 1);
    let t0 = Instant::now();
    let mut t = auth_target();
    let mut queues = Vec::new();
    for k in 0..authn::AUTH_STRIKES as u64 {
        let mut c = connect_to(t, bad, 1000 + k, t0, 0, DISCOVERY_NQN);
        let admin = c.admin;
        assert!(send(&mut c, admin, &negotiate()).status().is_success());
        queues.push(admin);
        t = c.t;
    }
    let later = t0 + authn::AUTH_TIMEOUT + Duration::from_secs(1);
    t.poll_timeouts(later);
    let mut c = Conv {
        t,
        now: later,
        admin: queues[0],
        cid: 0,
    };
    // The same queue begins again: refused, the address has used up its strikes.
    assert_eq!(
        send(&mut c, queues[0], &negotiate()).status(),
        Status::COMMAND_INTERRUPTED
    );
}

/// The DH arithmetic of an authentication is left as a job for another thread: the Send
/// that needs it is held, the queue refuses a second authentication command meanwhile,
/// other controllers are served, and the job's result completes the Send and shapes the
/// Challenge. A job whose queue went, or whose transaction timed out, is not wanted.
#[test]
fn dh_work_is_a_job_and_holds_only_its_own_send() {
    let negotiate = |t_id| negotiate_to(SUB1, t_id);
    let mut c = connect_from(auth_target(), "10.0.0.1", 500, Instant::now());
    let admin = c.admin;
    let sqe = AuthCommand::dhchap(negotiate(1).len() as u32).to_sqe(0, true);
    assert_eq!(c.exec_on(admin, sqe, &mut negotiate(1)), Outcome::Deferred);
    let jobs = c.t.take_dh_jobs();
    assert_eq!(jobs.len(), 1);
    let job = jobs.into_iter().next().unwrap();
    assert_eq!(job.peer, Some("10.0.0.1".parse().unwrap()));
    assert_eq!(
        job.work.group(),
        DhGroup::Ffdhe2048,
        "the policy's first group"
    );
    // Meanwhile: this queue refuses another authentication command ...
    let rsqe = AuthCommand::dhchap(4096).to_sqe(0, false);
    match c.exec_on(admin, rsqe, &mut [0u8; 4096]) {
        Outcome::Complete { cqe, .. } => assert_eq!(cqe.status(), Status::COMMAND_SEQUENCE_ERROR),
        o => panic!("{o:?}"),
    }
    // ... and another controller is served (discovery never authenticates).
    let mut other = Conv::connect(c.t, DISCOVERY_NQN, HOST1);
    assert!(other.property_get(0, true).status().is_success());
    c.t = other.t;
    // The result completes the held Send, and the Challenge carries the new public value.
    let done = job.work.run(&mut *seeded(5));
    let id = job.id;
    let actions = c.t.dh_done(id, done, c.now);
    assert!(
        matches!(&actions[..], [Action::CompleteHeld { queue, key: 500, cqe }] if *queue == admin && cqe.status().is_success() && cqe.cid == 1),
        "{actions:?}"
    );
    assert!(!c.t.dh_wanted(&id), "a job is done once");
    assert!(c
        .t
        .dh_done(
            id,
            DhWork::KeyPair(DhGroup::Ffdhe2048).run(&mut *seeded(5)),
            c.now
        )
        .is_empty());
    let (cqe, chal) = receive(&mut c, admin);
    assert!(cqe.status().is_success());
    assert_eq!(chal[1], crate::auth::msg::auth_id::CHALLENGE);
    assert!(
        chal.len() > 256,
        "the Challenge carries a 2048-bit DH value"
    );

    // A job whose queue closed before it ran is not wanted, and its result does nothing.
    let mut c = connect_from(c.t, "10.0.0.2", 600, Instant::now());
    let admin = c.admin;
    assert_eq!(c.exec_on(admin, sqe, &mut negotiate(2)), Outcome::Deferred);
    let job = c.t.take_dh_jobs().pop().unwrap();
    c.t.queue_closed(admin, 600);
    assert!(!c.t.dh_wanted(&job.id));
    assert!(c
        .t
        .dh_done(job.id, job.work.run(&mut *seeded(6)), c.now)
        .is_empty());

    // The time a job waits for a DH thread is the target's, not the host's: past both
    // the queue's and the step's deadlines nothing is dropped while it is out; its result
    // starts the deadlines over, and then they apply again.
    let now = Instant::now();
    // (KATO 0: no keep-alive deadline in the way.)
    // (A target of its own: the controllers above have keep-alive deadlines.)
    let mut c = connect_from_kato(auth_target(), "10.0.0.3", 700, now, 0);
    let admin = c.admin;
    assert_eq!(c.exec_on(admin, sqe, &mut negotiate(3)), Outcome::Deferred);
    let job = c.t.take_dh_jobs().pop().unwrap();
    let late = now + 2 * AUTH_TIMEOUT;
    assert!(
        c.t.next_timeout().is_none_or(|t| t > late),
        "no authentication deadline while the job is out: {:?}",
        c.t.next_timeout().map(|t| t - now)
    );
    c.t.poll_timeouts(late);
    assert!(refusals(&mut c.t).is_empty(), "nothing timed out");
    let actions = c.t.dh_done(job.id, job.work.run(&mut *seeded(7)), late);
    assert!(
        matches!(&actions[..], [Action::CompleteHeld { cqe, .. }] if cqe.status().is_success())
    );
    c.now = late;
    let (cqe, m) = receive(&mut c, admin);
    assert!(cqe.status().is_success());
    assert_eq!(m[1], crate::auth::msg::auth_id::CHALLENGE);
    c.t.poll_timeouts(late + AUTH_TIMEOUT);
    assert_eq!(
        refusals(&mut c.t)[0].reason,
        RefusalReason::AuthenticationTimeout {
            secs: AUTH_TIMEOUT.as_secs()
        },
        "the deadlines apply again once the job is done"
    );
}

/// A Negotiate that starts a transaction over on a queue not yet authenticated costs a
/// DH key pair each time: it counts as an abandoned transaction, so one connection cannot
/// have the target compute key pairs without end.
#[test]
fn restarting_negotiates_count_as_strikes() {
    let negotiate = || negotiate_to(SUB1, 1);
    let mut c = connect_from(auth_target(), "10.0.0.9", 900, Instant::now());
    let admin = c.admin;
    assert!(send(&mut c, admin, &negotiate()).status().is_success());
    for k in 0..authn::AUTH_STRIKES {
        let cqe = send(&mut c, admin, &negotiate());
        assert!(cqe.status().is_success(), "restart {k}: {}", cqe.status());
    }
    let cqe = send(&mut c, admin, &negotiate());
    assert_eq!(cqe.status(), Status::COMMAND_INTERRUPTED);
    assert!(matches!(
        refusals(&mut c.t)[..],
        [Refusal {
            reason: RefusalReason::AuthenticationThrottled { .. },
            ..
        }]
    ));
}

/// The throttle is per host NQN and address, and a host's strikes go when its secret
/// changes: after a key rotation (the reload audit of 2026-11-27: a host retrying its
/// stale key struck out the address, and with it every host behind it, for a minute),
/// the host gets in with its new key at once.
#[test]
fn new_credentials_clear_a_hosts_strikes() {
    let addr = "10.0.0.99";
    let now = Instant::now();
    let mut t = auth_target();
    for k in 0..authn::AUTH_STRIKES as u64 {
        let mut c = connect_from(t, addr, 1000 + k, now);
        let admin = c.admin;
        assert!(send(&mut c, admin, &negotiate_to(SUB1, 1))
            .status()
            .is_success());
        c.t.queue_closed(admin, 1000 + k);
        t = c.t;
    }
    let mut c = connect_from(t, addr, 2000, now);
    let admin = c.admin;
    assert_eq!(
        send(&mut c, admin, &negotiate_to(SUB1, 1)).status(),
        Status::COMMAND_INTERRUPTED,
        "struck out"
    );
    let mut t = c.t;
    // The same secret again (a reload that changed something else): still struck out.
    t.set_host_credentials([(HOST1.to_string(), creds(0x11, Some(0x22)))]);
    let mut c = connect_from(t, addr, 2001, now);
    let admin = c.admin;
    assert_eq!(
        send(&mut c, admin, &negotiate_to(SUB1, 1)).status(),
        Status::COMMAND_INTERRUPTED
    );
    // A new secret: the slate is clean.
    let mut t = c.t;
    t.set_host_credentials([(HOST1.to_string(), creds(0x33, Some(0x22)))]);
    let mut c = connect_from(t, addr, 2002, now);
    let admin = c.admin;
    authenticate(&mut c, admin, 0x33, Some(0x22), 1).unwrap();
}

/// First authentications still running count against the throttle (the audit of
/// 2026-11-27: 400 connections from one address, each with one Negotiate for a host
/// whose secret the peer did not know, made the target compute 400 FFDHE key pairs,
/// 8.4 s of CPU, before the first strike): with FIRST_AUTH_UNDER_WAY under way (more
/// than AUTH_STRIKES: a host reconnecting all its controllers after a target restart
/// must get through), the next controller's Negotiate is refused with no DH work.
#[test]
fn first_authentications_under_way_count_against_the_throttle() {
    let addr = "10.0.0.98";
    let now = Instant::now();
    let mut t = auth_target();
    let mut open = Vec::new();
    for k in 0..authn::FIRST_AUTH_UNDER_WAY as u64 {
        let mut c = connect_from(t, addr, 1000 + k, now);
        let admin = c.admin;
        assert!(send(&mut c, admin, &negotiate_to(SUB1, 1))
            .status()
            .is_success());
        open.push(admin);
        t = c.t;
    }
    let mut c = connect_from(t, addr, 2000, now);
    let admin = c.admin;
    assert_eq!(
        send(&mut c, admin, &negotiate_to(SUB1, 1)).status(),
        Status::COMMAND_INTERRUPTED
    );
    let r = refusals(&mut c.t);
    assert_eq!(
        r[0].reason,
        RefusalReason::AuthenticationThrottled {
            strikes: 0,
            under_way: authn::FIRST_AUTH_UNDER_WAY,
            secs: authn::STRIKE_WINDOW.as_secs()
        }
    );
    assert!(
        r[0].reason
            .to_string()
            .contains("and has 64 more under way on other controllers"),
        "{}",
        r[0].reason
    );
    // Another address is not held back.
    let mut c = connect_from(c.t, "10.0.0.97", 2001, now);
    let admin = c.admin;
    authenticate(&mut c, admin, 0x11, Some(0x22), 1).unwrap();
    // One of them goes away abandoned: a strike, and one fewer under way, so still as
    // many together.
    let mut t = c.t;
    t.queue_closed(open[0], 1000);
    let mut c = connect_from(t, addr, 2002, now);
    let admin = c.admin;
    assert_eq!(
        send(&mut c, admin, &negotiate_to(SUB1, 1)).status(),
        Status::COMMAND_INTERRUPTED
    );
}
