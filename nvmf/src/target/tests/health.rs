//! A drive's SMART / Health log through Get Log Page 02h, and the SMART / Health events
//! its critical warnings raise (issue 13: the nvme backend's drive feeds log 02h).

use super::*;
use crate::spec::log::aen;

/// A drive's log page: a temperature, wear, spare, media errors and a warning.
fn drive_log(warning: u8, kelvin: u16, spare: u8, used: u8, media_errors: u128) -> [u8; 512] {
    let mut sensors = [0u16.into(); 8];
    sensors[0] = kelvin.saturating_sub(2).into();
    let l = SmartLog {
        critical_warning: warning,
        composite_temperature: kelvin.into(),
        available_spare: spare,
        available_spare_threshold: 10,
        percentage_used: used,
        power_cycles: 7u128.into(),
        unsafe_shutdowns: 3u128.into(),
        media_errors: media_errors.into(),
        // Traffic of other users of the drive: not what this controller reports.
        host_read_commands: 999_999u128.into(),
        data_units_read: 999_999u128.into(),
        temperature_sensor: sensors,
        ..Default::default()
    };
    let mut out = [0u8; 512];
    out.copy_from_slice(l.as_bytes());
    out
}

fn smart(c: &mut Conv, nsid: u32, rae: bool) -> SmartLog {
    let mut buf = vec![0u8; 512];
    c.cid = c.cid.wrapping_add(1);
    let mut sqe = get_log(lid::SMART_HEALTH, 512, 0, rae, nsid);
    sqe.set_opcode_cid(sqe.opcode(), c.cid);
    let o = c.t.execute(c.now, c.admin, &sqe, &mut buf, &Counters);
    assert!(
        matches!(o, Outcome::Complete { cqe, data_len: 512 } if cqe.status().is_success()),
        "{o:?}"
    );
    SmartLog::read_from_bytes(&buf).unwrap()
}

#[test]
fn a_drive_backed_namespace_reports_the_drives_health_and_our_traffic() {
    let mut t = target();
    t.add_namespace(SUB1, ns(2)).unwrap();
    t.add_namespace(SUB1, ns(3)).unwrap();
    let mut c = Conv::enabled(t, SUB1, HOST1);
    // Before any drive reports: the software defaults.
    let before = smart(&mut c, 2, false);
    assert_eq!(before.composite_temperature.get(), 0);
    assert_eq!(before.available_spare, 100);
    c.t.set_device_health(SUB1, 2, &drive_log(0, 310, 90, 4, 5))
        .unwrap();
    c.t.set_device_health(SUB1, 3, &drive_log(0, 330, 60, 9, 1))
        .unwrap();
    let two = smart(&mut c, 2, false);
    assert_eq!(two.composite_temperature.get(), 310);
    assert_eq!(two.temperature_sensor[0].get(), 308);
    assert_eq!(
        (two.available_spare, two.available_spare_threshold),
        (90, 10)
    );
    assert_eq!(two.percentage_used, 4);
    assert_eq!((two.power_cycles.get(), two.unsafe_shutdowns.get()), (7, 3));
    assert_eq!(
        two.media_errors.get(),
        5,
        "the drive's count, not ours added to it"
    );
    // Traffic is what went through this target (Counters: 10 reads per NSID unit).
    assert_eq!(two.host_read_commands.get(), 20);
    assert_eq!(two.data_units_read.get(), 2);
    // All namespaces: 1 (no drive) + 2 + 3 combined.
    let all = smart(&mut c, 0xffff_ffff, false);
    assert_eq!(all.composite_temperature.get(), 330, "the hottest drive");
    assert_eq!(all.available_spare, 60, "the lowest spare");
    assert_eq!(all.percentage_used, 9, "the most worn");
    assert_eq!(all.power_cycles.get(), 14);
    assert_eq!(
        all.media_errors.get(),
        2 + 5 + 1,
        "ours for NSID 1, the drives' for 2 and 3"
    );
    assert_eq!(all.host_read_commands.get(), 60);
    // A removed namespace forgets its drive; an unknown one is refused.
    c.t.remove_namespace(SUB1, 3).unwrap();
    assert_eq!(
        smart(&mut c, 0xffff_ffff, false)
            .composite_temperature
            .get(),
        310
    );
    assert_eq!(
        c.t.set_device_health(SUB1, 3, &drive_log(0, 1, 1, 1, 1)),
        Err(TargetError::UnknownNamespace(3))
    );
}

#[test]
fn a_new_critical_warning_raises_the_smart_event_the_host_enabled() {
    let mut t = target();
    t.add_namespace(SUB1, ns(2)).unwrap();
    let mut c = Conv::enabled(t, SUB1, HOST1);
    // AEC: temperature (bit 1) and spare (bit 0) enabled, reliability bits not.
    let (cqe, _) = c.admin(set_features(fid::ASYNC_EVENT_CONFIG, 0b11));
    assert!(cqe.status().is_success());
    let mut none = [0u8; 0];
    assert_eq!(
        c.exec_on(c.admin, admin_sqe(admin::ASYNC_EVENT_REQUEST, 0), &mut none),
        Outcome::Deferred
    );
    let aer = c.cid;
    // Read-only (bit 3, reliability) is not enabled: nothing.
    let a =
        c.t.set_device_health(SUB1, 2, &drive_log(1 << 3, 300, 90, 0, 0))
            .unwrap();
    assert!(a.is_empty(), "{a:?}");
    // The temperature warning appears: the held AER completes with type 1h, info 01h,
    // log 02h.
    let a =
        c.t.set_device_health(SUB1, 2, &drive_log(1 << 3 | 1 << 1, 360, 90, 0, 0))
            .unwrap();
    let dw0 = aen::dw0(
        aen::TYPE_SMART_HEALTH,
        aen::INFO_TEMPERATURE,
        lid::SMART_HEALTH,
    );
    assert!(
        matches!(&a[..], [Action::CompleteHeld { cqe, .. }] if cqe.cid == aer && cqe.dw0 == dw0),
        "{a:?}"
    );
    assert_eq!(dw0, 0x02_01_01);
    // Still set on the next report: no new event; cleared and set again while masked
    // (log not read): none either; the event waits for the next AER only once.
    assert!(c
        .t
        .set_device_health(SUB1, 2, &drive_log(1 << 1, 360, 90, 0, 0))
        .unwrap()
        .is_empty());
    assert!(c
        .t
        .set_device_health(SUB1, 2, &drive_log(0, 300, 90, 0, 0))
        .unwrap()
        .is_empty());
    assert!(c
        .t
        .set_device_health(SUB1, 2, &drive_log(1 << 1, 360, 90, 0, 0))
        .unwrap()
        .is_empty());
    // RAE keeps it masked; a read without RAE unmasks it.
    smart(&mut c, 0xffff_ffff, true);
    assert!(c
        .t
        .set_device_health(SUB1, 2, &drive_log(0, 300, 90, 0, 0))
        .unwrap()
        .is_empty());
    assert!(c
        .t
        .set_device_health(SUB1, 2, &drive_log(1 << 1, 360, 90, 0, 0))
        .unwrap()
        .is_empty());
    let log = smart(&mut c, 2, false);
    assert_eq!(log.critical_warning, 1 << 1);
    c.t.set_device_health(SUB1, 2, &drive_log(0, 300, 90, 0, 0))
        .unwrap();
    // Spare below threshold, no AER outstanding: it waits for the next AER.
    assert!(c
        .t
        .set_device_health(SUB1, 2, &drive_log(1, 300, 5, 0, 0))
        .unwrap()
        .is_empty());
    match c.exec_on(c.admin, admin_sqe(admin::ASYNC_EVENT_REQUEST, 0), &mut none) {
        Outcome::Complete { cqe, .. } => assert_eq!(
            cqe.dw0,
            aen::dw0(
                aen::TYPE_SMART_HEALTH,
                aen::INFO_SPARE_BELOW_THRESHOLD,
                lid::SMART_HEALTH
            )
        ),
        o => panic!("{o:?}"),
    }
    // Get Features reports the SMART bits the host set.
    let (cqe, _) = c.admin(get_features(fid::ASYNC_EVENT_CONFIG, 0, 0));
    assert_eq!(cqe.dw0 & 0xff, 0b11);
}
